#include "zoo/image_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

#include "core/error.h"
#include "zoo/gpt_dataset.h"
#include "zoo/safetensors.h"

namespace tessel::zoo {

namespace {

// SplitMix64: a well-mixed 64-bit hash, so synthetic pixels and labels need
// no state.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
double Unit(uint64_t x) { return static_cast<double>(Mix(x) >> 11) * 0x1.0p-53; }  // [0, 1)

int64_t ReadInteger(const uint8_t* at, const std::string& dtype) {
  auto get = [&]<typename T>(T) {
    T v;
    std::memcpy(&v, at, sizeof(T));
    return static_cast<int64_t>(v);
  };
  if (dtype == "U8") return get(uint8_t{});
  if (dtype == "I8") return get(int8_t{});
  if (dtype == "I16") return get(int16_t{});
  if (dtype == "U16") return get(uint16_t{});
  if (dtype == "I32") return get(int32_t{});
  if (dtype == "U32") return get(uint32_t{});
  if (dtype == "I64") return get(int64_t{});
  uint64_t v;
  std::memcpy(&v, at, 8);
  return v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v);  // U64
}

}  // namespace

ImageDataset::ImageDataset(ImageDataset&&) noexcept = default;
ImageDataset::~ImageDataset() = default;

ImageDataset ImageDataset::Load(const std::string& path) {
  ImageDataset d;
  d.name_ = path;
  d.file_ = std::make_unique<SafetensorsFile>(path);
  const SafetensorsFile& f = *d.file_;
  const SafetensorsEntry& images = f.entry("images");
  const SafetensorsEntry& labels = f.entry("labels");
  TESSEL_CHECK(images.dtype == "U8" || images.dtype == "F32")
      << "image dataset " << path << ": images are " << images.dtype << "; expected U8 or F32";
  TESSEL_CHECK((images.shape.size() == 3 || images.shape.size() == 4) && images.numel() > 0)
      << "image dataset " << path << ": images of shape [" << images.shape.size()
      << " dims]; expected [N, H, W] or [N, C, H, W] with no zero dimension";
  static const char* kIntegers[] = {"U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"};
  TESSEL_CHECK(std::find(std::begin(kIntegers), std::end(kIntegers), labels.dtype) != std::end(kIntegers))
      << "image dataset " << path << ": labels are " << labels.dtype << "; expected an integer dtype";
  d.size_ = images.shape[0];
  d.channels_ = images.shape.size() == 4 ? images.shape[1] : 1;
  d.height_ = images.shape[images.shape.size() - 2];
  d.width_ = images.shape.back();
  TESSEL_CHECK(labels.shape.size() == 1 && labels.shape[0] == d.size_)
      << "image dataset " << path << ": " << (labels.shape.empty() ? 0 : labels.shape[0])
      << " labels (or not one dimension) for " << d.size_ << " images; expected one label per image";
  d.u8_ = images.dtype == "U8";
  d.pixel_max_ = d.u8_ ? 255 : 1;
  if (auto it = f.metadata().find("pixel_max"); it != f.metadata().end()) {
    char* end = nullptr;
    d.pixel_max_ = std::strtod(it->second.c_str(), &end);
    TESSEL_CHECK(end != it->second.c_str() && *end == '\0' && d.pixel_max_ > 0 && std::isfinite(d.pixel_max_))
        << "image dataset " << path << ": metadata pixel_max '" << it->second
        << "'; expected a positive number";
  }
  const std::span<const uint8_t> label_bytes = f.bytes("labels");
  const size_t label_size = SafetensorsElementSize(labels.dtype);
  int64_t largest = -1;
  d.labels_.resize(static_cast<size_t>(d.size_));
  for (int64_t i = 0; i < d.size_; ++i) {
    d.labels_[i] = ReadInteger(label_bytes.data() + i * label_size, labels.dtype);
    TESSEL_CHECK(d.labels_[i] >= 0) << "image dataset " << path << ": label " << i << " is negative";
    largest = std::max(largest, d.labels_[i]);
  }
  d.num_classes_ = largest + 1;
  if (auto it = f.metadata().find("num_classes"); it != f.metadata().end()) {
    char* end = nullptr;
    d.num_classes_ = std::strtoll(it->second.c_str(), &end, 10);
    TESSEL_CHECK(end != it->second.c_str() && *end == '\0' && d.num_classes_ > largest)
        << "image dataset " << path << ": metadata num_classes '" << it->second
        << "'; expected an integer above the largest label " << largest;
  }
  // Pixels outside [0, pixel_max] mean the file's scale is not what it says
  // (nothing to check for bytes against 255 and more).
  const std::span<const uint8_t> pixels = f.bytes("images");
  const int64_t count = d.u8_ && d.pixel_max_ >= 255 ? 0 : images.numel();
  for (int64_t k = 0; k < count; ++k) {
    double v;
    if (d.u8_) {
      v = pixels[k];
    } else {
      float x;
      std::memcpy(&x, pixels.data() + 4 * k, 4);
      v = x;
    }
    TESSEL_CHECK(v >= 0 && v <= d.pixel_max_) << "image dataset " << path << ": pixel " << k << " is " << v
                                              << "; expected 0 .. pixel_max " << d.pixel_max_;
  }
  return d;
}

ImageDataset ImageDataset::Synthetic(int64_t n, int64_t channels, int64_t size, int64_t num_classes,
                                     uint64_t seed) {
  TESSEL_CHECK(n > 0 && channels > 0 && size > 0 && num_classes > 0)
      << "synthetic images: " << n << " images of " << channels << " x " << size << " x " << size << " in "
      << num_classes << " classes; expected positive sizes";
  ImageDataset d;
  d.name_ = "synthetic";
  d.size_ = n;
  d.channels_ = channels;
  d.height_ = d.width_ = size;
  d.num_classes_ = num_classes;
  d.seed_ = seed;
  return d;
}

int64_t ImageDataset::Label(int64_t i) const {
  TESSEL_CHECK(i >= 0 && i < size_) << "image dataset " << name_ << ": image " << i << " of " << size_;
  if (file_) return labels_[i];
  return static_cast<int64_t>(Mix(seed_ ^ Mix(static_cast<uint64_t>(i))) %
                              static_cast<uint64_t>(num_classes_));
}

void ImageDataset::Image(int64_t i, float* out) const {
  const int64_t numel = image_numel();
  if (file_) {
    TESSEL_CHECK(i >= 0 && i < size_) << "image dataset " << name_ << ": image " << i << " of " << size_;
    const uint8_t* at = file_->bytes("images").data() + static_cast<size_t>(i * numel) * (u8_ ? 1 : 4);
    for (int64_t k = 0; k < numel; ++k) {
      double v;
      if (u8_) {
        v = at[k];
      } else {
        float x;
        std::memcpy(&x, at + 4 * k, 4);
        v = x;
      }
      out[k] = static_cast<float>((v / pixel_max_ - 0.5) / 0.5);
    }
    return;
  }
  // A plane wave whose direction, frequency and phase the class gives, per
  // channel, plus noise of a quarter of its amplitude.
  const uint64_t c = static_cast<uint64_t>(Label(i));
  for (int64_t ch = 0; ch < channels_; ++ch) {
    const uint64_t key = Mix(seed_ + 1) ^ Mix(c * 131 + static_cast<uint64_t>(ch));
    const double angle = 2 * std::numbers::pi * Unit(key), phase = 2 * std::numbers::pi * Unit(key + 1);
    const double frequency = (1 + 2 * Unit(key + 2)) / static_cast<double>(width_);
    for (int64_t y = 0; y < height_; ++y)
      for (int64_t x = 0; x < width_; ++x) {
        const double wave =
            std::sin(2 * std::numbers::pi * frequency * (x * std::cos(angle) + y * std::sin(angle)) + phase);
        const uint64_t pixel =
            static_cast<uint64_t>((i * channels_ + ch) * height_ * width_ + y * width_ + x);
        const double noise = Unit(Mix(seed_ + 2) ^ Mix(pixel)) - 0.5;
        out[(ch * height_ + y) * width_ + x] = static_cast<float>(0.8 * wave + 0.4 * noise);
      }
  }
}

std::vector<std::vector<int64_t>> SplitSamples(const std::string& split, int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i)  // Fisher-Yates, the same on every platform
    std::swap(order[i], order[rng() % static_cast<uint64_t>(i + 1)]);
  std::vector<std::vector<int64_t>> out;
  for (const DocumentRange& r : SplitDocuments(split, static_cast<size_t>(n)))
    out.emplace_back(order.begin() + static_cast<int64_t>(r.begin),
                     order.begin() + static_cast<int64_t>(r.end));
  return out;
}

}  // namespace tessel::zoo
