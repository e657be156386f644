// Runs the crop/resize kernel (crates/cuda/src/nvjpeg/crop_resize.cu) on the CPU, one "thread"
// at a time, so that CI (no GPU) checks the kernel's own indexing, layouts, flip and arithmetic
// against the Rust reference. Built by kernel_cpu.rs with -ffp-contract=off, as NVRTC builds the
// kernel with --fmad=false.
//
// Built with -DKERNEL='"path/to/crop_resize.cu"'.
// usage: kernel_on_cpu in.rgb W H cx cy cw ch wx wy ww wh flip OH OW nchw aa f32 out
// (the window wx wy ww wh as the bits of each float, in decimal)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct Dim {
    unsigned x, y, z;
};
static Dim blockIdx, threadIdx, blockDim;
#define __global__
#define __device__
#define __forceinline__
using std::max;
using std::min;
#include KERNEL

static float float_bits(const char* text) {
    unsigned bits = unsigned(strtoul(text, nullptr, 10));
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int main(int argc, char** argv) {
    if (argc != 19) return 2;
    int W = atoi(argv[2]), H = atoi(argv[3]);
    std::vector<unsigned char> src(size_t(W) * H * 3);
    FILE* f = fopen(argv[1], "rb");
    if (!f || fread(src.data(), 1, src.size(), f) != src.size()) return 3;
    fclose(f);
    CropParams p{};
    p.src = (unsigned long long)src.data();
    p.pitch = W * 3;
    p.crop_x = atoi(argv[4]);
    p.crop_y = atoi(argv[5]);
    p.crop_w = atoi(argv[6]);
    p.crop_h = atoi(argv[7]);
    p.win_x = float_bits(argv[8]);
    p.win_y = float_bits(argv[9]);
    p.win_w = float_bits(argv[10]);
    p.win_h = float_bits(argv[11]);
    p.flip = atoi(argv[12]);
    int OH = atoi(argv[13]), OW = atoi(argv[14]), nchw = atoi(argv[15]), aa = atoi(argv[16]);
    int f32 = atoi(argv[17]);
    std::vector<unsigned char> o8(size_t(OH) * OW * 3);
    std::vector<float> of(size_t(OH) * OW * 3);
    blockDim = {256, 1, 1};
    for (unsigned b = 0; b < unsigned(OH * OW + 255) / 256; ++b) {
        for (unsigned t = 0; t < 256; ++t) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            crop_resize(&p, f32 ? nullptr : o8.data(), f32 ? of.data() : nullptr, OH, OW, nchw,
                        aa, 0.485f, 0.456f, 0.406f, 0.229f, 0.224f, 0.225f);
        }
    }
    FILE* g = fopen(argv[18], "wb");
    if (!g) return 4;
    if (f32) fwrite(of.data(), 4, of.size(), g);
    else fwrite(o8.data(), 1, o8.size(), g);
    fclose(g);
    return 0;
}
