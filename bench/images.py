"""JPEG images (`ImageLoader`), one mode a workload:

python3 bench/images.py MODE [ARGS...]   (MODE --help for its arguments)"""

from lib.modes import dispatch

MODES = {
    "make": ("lib.make_images", "an ImageFolder of JPEGs cut from sample photographs"),
    "loaders": ("lib.images_gpu", "DataLoader, decode_jpeg(cuda), ImageLoader cpu/gpu, resnet50"),
    "cpu": ("lib.images_cpu", "pinfeed's CPU decode against Pillow, no GPU"),
    "torchvision": ("lib.nvjpeg_torchvision", "decode_jpeg(device='cuda') + crop, images/s"),
}

if __name__ == "__main__":
    dispatch(__doc__, MODES)
