#!/usr/bin/env python3
"""Writes the bundled handwritten digits, data/digits/digits.safetensors (see
its README), from the copy scikit-learn ships (no download).

    pip install --target /tmp/pydeps scikit-learn safetensors "numpy<2"
    PYTHONPATH=/tmp/pydeps python3 tools/make_digits.py

The file holds "images" (uint8 [1797, 8, 8], grey levels 0..16) and "labels"
(int64 [1797], 0..9), with metadata pixel_max=16 and num_classes=10, in the
layout tessel's image dataset reads (zoo/image_dataset.h). It is written by
the `safetensors` package itself, so reading it also checks tessel's reader
against the format's own writer.
"""
import os

import numpy as np
from safetensors.numpy import save_file
from sklearn.datasets import load_digits

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "digits"))


def main():
    digits = load_digits()
    images = digits.images.astype(np.uint8)  # float 0..16 in scikit-learn, whole numbers
    assert (images == digits.images).all() and images.max() == 16
    labels = digits.target.astype(np.int64)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "digits.safetensors")
    save_file({"images": images, "labels": labels}, path,
              metadata={"pixel_max": "16", "num_classes": "10",
                        "source": "scikit-learn load_digits (UCI Optical Recognition of Handwritten Digits, "
                                  "CC BY 4.0)"})
    print(f"wrote {path}: {images.shape[0]} images of {images.shape[1]}x{images.shape[2]}, "
          f"classes {np.bincount(labels).tolist()}")


if __name__ == "__main__":
    main()
