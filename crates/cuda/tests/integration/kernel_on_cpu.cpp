// Runs the crop/resize kernel (crates/cuda/src/nvjpeg/crop_resize.cu) on the CPU, one "thread"
// at a time, so that CI (no GPU) checks the kernel's own indexing, layouts, flip and arithmetic
// against the Rust reference. Built by kernel_cpu.rs with -ffp-contract=off, as NVRTC builds the
// kernel with --fmad=false.
//
// Built with -DKERNEL='"path/to/crop_resize.cu"'.
// usage: kernel_on_cpu in.rgb W H cx cy cw ch flip OH OW nchw aa f32 out
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

int main(int argc, char** argv) {
    if (argc != 15) return 2;
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
    p.flip = atoi(argv[8]);
    int OH = atoi(argv[9]), OW = atoi(argv[10]), nchw = atoi(argv[11]), aa = atoi(argv[12]);
    int f32 = atoi(argv[13]);
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
    FILE* g = fopen(argv[14], "wb");
    if (!g) return 4;
    if (f32) fwrite(of.data(), 4, of.size(), g);
    else fwrite(o8.data(), 1, o8.size(), g);
    fclose(g);
    return 0;
}
