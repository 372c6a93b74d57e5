// Image classification data: images with integer labels, from a safetensors
// file or synthetic.
//
// The file holds "images", [N, H, W] (one channel) or [N, C, H, W], U8 or
// F32, and "labels", [N], any integer dtype, with optional metadata
// "pixel_max" (the value of white: 255 for U8 and 1 for F32 unless given)
// and "num_classes" (else the largest label + 1). Such a file is what the
// `safetensors` package writes from numpy arrays (tools/make_digits.py
// writes the bundled digits that way).
//
// Pixels come out as ViT's image processors give them: scaled to [0, 1] by
// pixel_max, then normalised with mean 0.5 and std 0.5 to [-1, 1].
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessel::zoo {

class SafetensorsFile;

class ImageDataset {
 public:
  // Reads and checks the file: shapes, dtypes, labels in [0, num_classes),
  // pixels in [0, pixel_max]; throws naming the file, tensor and value.
  static ImageDataset Load(const std::string& path);
  // `n` images of `channels` x size x size in `num_classes` classes: each
  // class a smooth pattern of its own (a plane wave of a class-given
  // frequency and phase), each image its class's pattern plus noise, the
  // label of image i drawn from `seed`. Learnable, any size, no storage.
  static ImageDataset Synthetic(int64_t n, int64_t channels, int64_t size, int64_t num_classes,
                                uint64_t seed);

  ImageDataset(ImageDataset&&) noexcept;
  ~ImageDataset();

  const std::string& name() const { return name_; }
  int64_t size() const { return size_; }
  int64_t channels() const { return channels_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  int64_t num_classes() const { return num_classes_; }
  int64_t image_numel() const { return channels_ * height_ * width_; }
  // Image i ([C, H, W], normalised) written to out[0, image_numel()).
  void Image(int64_t i, float* out) const;
  int64_t Label(int64_t i) const;

 private:
  ImageDataset() = default;
  std::string name_;
  int64_t size_ = 0, channels_ = 1, height_ = 0, width_ = 0, num_classes_ = 0;
  // From a file: its pixels as read (U8 or F32) and labels.
  std::unique_ptr<SafetensorsFile> file_;
  bool u8_ = true;
  double pixel_max_ = 255;
  std::vector<int64_t> labels_;
  // Synthetic.
  uint64_t seed_ = 0;
};

// Sample indices of the train, validation and test splits: a permutation of
// 0 .. n-1 drawn from `seed`, cut by the proportions of `split` ("80,20,0";
// as SplitDocuments reads it).
std::vector<std::vector<int64_t>> SplitSamples(const std::string& split, int64_t n, uint64_t seed);

}  // namespace tessel::zoo
