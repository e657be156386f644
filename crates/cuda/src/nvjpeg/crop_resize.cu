// Crop, resize, flip and lay out a batch of decoded RGB images in one launch; compiled at run time
// by NVRTC with --fmad=false, so that its float arithmetic is the same IEEE sequence as the CPU
// reference in resize.rs (`crop_resize_reference`), step for step.
//
// The resize is torchvision's bilinear (`antialias=False`: a triangle filter of radius 1 in source
// pixels) or its antialiased bilinear (`antialias=True`, the default of transforms.v2: the
// triangle widened by the scale when shrinking, as PIL does), with half-pixel centres and the taps
// limited to the crop box; a window resizes a fractional part of the box (a center crop: the box
// is the whole image). The horizontal flip mirrors the resized image. uint8 output rounds half
// up; float output normalises that uint8 value as ToDtype(scale=True) + Normalize(mean, std) do.

struct CropParams {
    unsigned long long src;  // device address of the decoded image, RGB interleaved
    int pitch;               // bytes per source row
    int crop_x, crop_y, crop_w, crop_h;
    int flip;                // 1: mirror the output horizontally
    int out_index;           // the image's place in the output batch
    float win_x, win_y;      // the part of the crop resized to the output, in the crop's pixels
    float win_w, win_h;      // (0, 0, crop_w, crop_h: all of it)
    int pad;
};

__device__ __forceinline__ float triangle(float x) {
    x = fabsf(x);
    return x < 1.0f ? 1.0f - x : 0.0f;
}

// The taps [*lo, *hi) of output index `i` along one axis, the centre and the filter's scale: the
// window [start, start + size) of the crop's `in_size` pixels is resized to `out_size`, and the
// taps are the crop's pixels under the filter.
__device__ __forceinline__ void taps(int i, int out_size, float start, float size, int in_size,
                                     int antialias, int* lo, int* hi, float* center, float* inv) {
    float scale = size / (float)out_size;
    bool widen = antialias && scale > 1.0f;
    float support = widen ? scale : 1.0f;
    *inv = widen ? 1.0f / scale : 1.0f;
    *center = start + scale * ((float)i + 0.5f);
    *lo = max((int)(*center - support + 0.5f), 0);
    *hi = min((int)(*center + support + 0.5f), in_size);
}

extern "C" __global__ void crop_resize(const CropParams* params, unsigned char* out_u8,
                                       float* out_f32, int oh, int ow, int nchw, int antialias,
                                       float m0, float m1, float m2, float s0, float s1,
                                       float s2) {
    const CropParams p = params[blockIdx.y];
    int pixel = blockIdx.x * blockDim.x + threadIdx.x;
    if (pixel >= oh * ow) return;
    int oy = pixel / ow;
    int ox = pixel % ow;
    int rx = p.flip ? ow - 1 - ox : ox;

    int ylo, yhi, xlo, xhi;
    float yc, yinv, xc, xinv;
    taps(oy, oh, p.win_y, p.win_h, p.crop_h, antialias, &ylo, &yhi, &yc, &yinv);
    taps(rx, ow, p.win_x, p.win_w, p.crop_w, antialias, &xlo, &xhi, &xc, &xinv);

    float xsum = 0.0f;
    for (int x = xlo; x < xhi; ++x) xsum = xsum + triangle(((float)x - xc + 0.5f) * xinv);

    const unsigned char* base = (const unsigned char*)p.src;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, ysum = 0.0f;
    for (int y = ylo; y < yhi; ++y) {
        float wy = triangle(((float)y - yc + 0.5f) * yinv);
        ysum = ysum + wy;
        const unsigned char* row =
            base + (long long)(p.crop_y + y) * p.pitch + (long long)p.crop_x * 3;
        float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f;
        for (int x = xlo; x < xhi; ++x) {
            float wx = triangle(((float)x - xc + 0.5f) * xinv);
            r0 = r0 + wx * (float)row[3 * x];
            r1 = r1 + wx * (float)row[3 * x + 1];
            r2 = r2 + wx * (float)row[3 * x + 2];
        }
        a0 = a0 + wy * r0;
        a1 = a1 + wy * r1;
        a2 = a2 + wy * r2;
    }
    float norm = xsum * ysum;
    float v[3] = {a0 / norm, a1 / norm, a2 / norm};
    float mean[3] = {m0, m1, m2};
    float stdv[3] = {s0, s1, s2};
    long long plane = (long long)oh * ow;
    long long first = (long long)p.out_index * 3 * plane;
    for (int c = 0; c < 3; ++c) {
        float r = fminf(fmaxf(floorf(v[c] + 0.5f), 0.0f), 255.0f);
        long long at = nchw ? first + c * plane + pixel : first + (long long)pixel * 3 + c;
        if (out_u8) {
            out_u8[at] = (unsigned char)r;
        } else {
            out_f32[at] = (r / 255.0f - mean[c]) / stdv[c];
        }
    }
}
