//! JPEG and PNG to 8-bit RGB, as Pillow's `Image.open(f).convert("RGB")` gives it: grayscale
//! replicated, CMYK converted, alpha dropped, palettes expanded. The frame header is read
//! first, so an image over the pixel limit is refused before anything is allocated for it.

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

/// Decodes `bytes` (a JPEG or PNG, told by its first bytes) into `out` as RGB rows, refusing
/// an image of more than `max_pixels` before decoding it; returns
/// (width, height). The error is one line saying what is wrong, for the caller to prefix
/// with the file's name.
pub fn decode_rgb(bytes: &[u8], max_pixels: u64, out: &mut Vec<u8>) -> Result<(u32, u32), String> {
    match bytes {
        [0xFF, 0xD8, 0xFF, ..] => jpeg(bytes, max_pixels, out),
        [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A, ..] => png(bytes, max_pixels, out),
        _ => Err(not_an_image(bytes)),
    }
}

fn not_an_image(bytes: &[u8]) -> String {
    let other = match bytes {
        [b'B', b'M', ..] => Some("BMP"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some("WebP"),
        [b'I', b'I', 42, 0, ..] | [b'M', b'M', 0, 42, ..] => Some("TIFF"),
        [b'G', b'I', b'F', b'8', ..] => Some("GIF"),
        [b'P', b'1'..=b'6', ..] => Some("PNM"),
        _ => None,
    };
    match other {
        Some(kind) => format!("a {kind} image; pinfeed decodes JPEG and PNG"),
        None if bytes.is_empty() => "an empty file, not an image".into(),
        None => format!(
            "not a JPEG or PNG image (it starts with {:02x?})",
            &bytes[..bytes.len().min(8)]
        ),
    }
}

fn check_pixels(kind: &str, width: u64, height: u64, max_pixels: u64) -> Result<(), String> {
    if width == 0 || height == 0 {
        return Err(format!("{kind} of {width}x{height} pixels: no pixels"));
    }
    if width * height > max_pixels {
        return Err(format!(
            "{kind} of {width}x{height} = {} pixels, over the limit of {max_pixels} pixels \
             (max_pixels; a guard against decompression bombs)",
            width * height
        ));
    }
    Ok(())
}

fn jpeg(bytes: &[u8], max_pixels: u64, out: &mut Vec<u8>) -> Result<(u32, u32), String> {
    // Strict: a truncated or corrupt stream is an error, as in Pillow, not gray filler.
    let options = DecoderOptions::new_fast()
        .set_strict_mode(true)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
        .jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    decoder
        .decode_headers()
        .map_err(|e| format!("not a valid JPEG: {e}"))?;
    let (width, height) = decoder.dimensions().ok_or("JPEG without a frame header")?;
    check_pixels("JPEG", width as u64, height as u64, max_pixels)?;
    let len = decoder
        .output_buffer_size()
        .ok_or("JPEG without a frame header")?;
    if len != width * height * 3 {
        return Err(format!(
            "JPEG decodes to {len} bytes, not the {} of {width}x{height} RGB",
            width * height * 3
        ));
    }
    out.resize(len, 0);
    decoder
        .decode_into(out)
        .map_err(|e| format!("corrupt or truncated JPEG: {e}"))?;
    Ok((width as u32, height as u32))
}

fn png(bytes: &[u8], max_pixels: u64, out: &mut Vec<u8>) -> Result<(u32, u32), String> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    // Palettes and low bit depths expanded to 8 bits, 16 bits to their high byte.
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let header = decoder
        .read_header_info()
        .map_err(|e| format!("not a valid PNG: {e}"))?;
    check_pixels(
        "PNG",
        u64::from(header.width),
        u64::from(header.height),
        max_pixels,
    )?;
    // Pillow opens 16-bit grayscale as mode "I;16", whose convert("RGB") clips each value to
    // 255 (40000 gives 255, not its high byte 156); every other 16-bit PNG it reads by its high
    // byte. So those samples are kept whole, and clipped below.
    let clip16 = header.color_type == png::ColorType::Grayscale
        && header.bit_depth == png::BitDepth::Sixteen;
    let transformations = if clip16 {
        png::Transformations::IDENTITY
    } else {
        png::Transformations::normalize_to_color8()
    };
    // The header passed the limit: let the decoder allocate what that image needs.
    let mut decoder = png::Decoder::new_with_limits(
        std::io::Cursor::new(bytes),
        png::Limits {
            bytes: usize::try_from(max_pixels.saturating_mul(8)).unwrap_or(usize::MAX),
        },
    );
    decoder.set_transformations(transformations);
    let mut reader = decoder
        .read_info()
        .map_err(|e| format!("not a valid PNG: {e}"))?;
    let size = reader
        .output_buffer_size()
        .ok_or("PNG too large for this machine")?;
    let mut raw = vec![0u8; size];
    let frame = reader
        .next_frame(&mut raw)
        .map_err(|e| format!("corrupt or truncated PNG: {e}"))?;
    let (w, h) = (frame.width as usize, frame.height as usize);
    let channels = match frame.color_type {
        png::ColorType::Grayscale if clip16 => 2,
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err("PNG palette left unexpanded".into()),
    };
    out.resize(w * h * 3, 0);
    let rows = raw.chunks_exact(frame.line_size).take(h);
    for (src, dst) in rows.zip(out.chunks_exact_mut(w * 3)) {
        for (px, rgb) in src.chunks_exact(channels).zip(dst.chunks_exact_mut(3)) {
            match channels {
                2 if clip16 => rgb.fill(u16::from_be_bytes([px[0], px[1]]).min(255) as u8),
                1 | 2 => rgb.fill(px[0]),
                _ => rgb.copy_from_slice(&px[..3]),
            }
        }
    }
    Ok((frame.width, frame.height))
}
