// Image datasets: the bundled digits (written by the `safetensors` package
// from scikit-learn's copy) read with their pixels, labels and classes;
// files of other layouts and dtypes; every kind of bad file named;
// synthetic images that are deterministic and differ by class; sample
// splits that are a seeded permutation.
#include "zoo/image_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "zoo/safetensors.h"

namespace tessel::zoo {
namespace {

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(ImageDataset, ReadsTheBundledDigits) {
  const std::string path = std::string(TESSEL_SOURCE_DIR) + "/data/digits/digits.safetensors";
  const ImageDataset d = ImageDataset::Load(path);
  EXPECT_EQ(d.size(), 1797);
  EXPECT_EQ(d.channels(), 1);
  EXPECT_EQ(d.height(), 8);
  EXPECT_EQ(d.width(), 8);
  EXPECT_EQ(d.num_classes(), 10);
  // scikit-learn's first digit is a 0 whose first row is 0 0 5 13 9 1 0 0.
  EXPECT_EQ(d.Label(0), 0);
  EXPECT_EQ(d.Label(1796), 8);
  std::vector<float> image(64);
  d.Image(0, image.data());
  const float expected[8] = {0, 0, 5, 13, 9, 1, 0, 0};
  for (int k = 0; k < 8; ++k) EXPECT_FLOAT_EQ(image[k], (expected[k] / 16.0f - 0.5f) / 0.5f) << k;
  std::vector<int64_t> per_class(10);
  for (int64_t i = 0; i < d.size(); ++i) ++per_class.at(d.Label(i));
  EXPECT_EQ(per_class, std::vector<int64_t>({178, 182, 177, 183, 181, 182, 181, 179, 174, 180}));
}

TEST(ImageDataset, ReadsFloatImagesWithChannelsAndNamesBadFiles) {
  const auto dir = std::filesystem::path(testing::TempDir()) / "image_dataset_test";
  std::filesystem::create_directories(dir);
  const Tensor rgb = Tensor::FromVector<float>({0, 0.5f, 1, 0.25f, 0, 0.5f, 1, 0.75f}, {2, 2, 1, 2});
  const Tensor labels = Tensor::FromVector<int32_t>({3, 1}, {2});
  WriteSafetensors(dir / "rgb.safetensors", {{"images", rgb}, {"labels", labels}});
  const ImageDataset d = ImageDataset::Load((dir / "rgb.safetensors").string());
  EXPECT_EQ(d.channels(), 2);
  EXPECT_EQ(d.height(), 1);
  EXPECT_EQ(d.width(), 2);
  EXPECT_EQ(d.num_classes(), 4);  // the largest label + 1
  std::vector<float> image(4);
  d.Image(1, image.data());
  EXPECT_EQ(image, std::vector<float>({-1, 0, 1, 0.5f}));

  auto load_error = [&](const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {}) {
    WriteSafetensors(dir / "bad.safetensors", tensors, metadata);
    return ErrorOf([&] { ImageDataset::Load((dir / "bad.safetensors").string()); });
  };
  const Tensor one_label = Tensor::FromVector<int64_t>({1}, {1});
  EXPECT_NE(load_error({{"images", rgb}}).find("holds no tensor 'labels'; it holds: images"),
            std::string::npos);
  EXPECT_NE(load_error({{"images", rgb}, {"labels", one_label}})
                .find("1 labels (or not one dimension) for 2 images"),
            std::string::npos);
  EXPECT_NE(load_error({{"images", Tensor::FromVector<int64_t>({1, 2}, {1, 1, 2})}, {"labels", one_label}})
                .find("images are I64; expected U8 or F32"),
            std::string::npos);
  EXPECT_NE(load_error({{"images", rgb}, {"labels", Tensor::FromVector<float>({1, 2}, {2})}})
                .find("labels are F32; expected an integer dtype"),
            std::string::npos);
  EXPECT_NE(load_error({{"images", rgb}, {"labels", Tensor::FromVector<int64_t>({1, -2}, {2})}})
                .find("label 1 is negative"),
            std::string::npos);
  EXPECT_NE(load_error({{"images", rgb}, {"labels", labels}}, {{"pixel_max", "0.5"}})
                .find("pixel 2 is 1; expected 0 .. pixel_max 0.5"),
            std::string::npos);
  EXPECT_NE(load_error({{"images", rgb}, {"labels", labels}}, {{"num_classes", "3"}})
                .find("metadata num_classes '3'; expected an integer above the largest label 3"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { ImageDataset::Load((dir / "none.safetensors").string()); }).find("cannot open"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ImageDataset, SyntheticImagesAreDeterministicAndDifferByClass) {
  const ImageDataset a = ImageDataset::Synthetic(64, 3, 8, 4, 11),
                     b = ImageDataset::Synthetic(64, 3, 8, 4, 11);
  std::set<int64_t> classes;
  std::vector<float> x(a.image_numel()), y(a.image_numel());
  for (int64_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a.Label(i), b.Label(i));
    a.Image(i, x.data());
    b.Image(i, y.data());
    EXPECT_EQ(x, y);
    for (float v : x) EXPECT_LE(std::abs(v), 1.0f);
    classes.insert(a.Label(i));
  }
  EXPECT_EQ(classes.size(), 4u);
  // Two images of one class are closer than images of different classes.
  auto distance = [&](int64_t i, int64_t j) {
    a.Image(i, x.data());
    a.Image(j, y.data());
    double d = 0;
    for (size_t k = 0; k < x.size(); ++k) d += (x[k] - y[k]) * (x[k] - y[k]);
    return d;
  };
  double same = 0, other = 0;
  int same_n = 0, other_n = 0;
  for (int64_t i = 0; i < 32; ++i)
    for (int64_t j = i + 1; j < 32; ++j)
      (a.Label(i) == a.Label(j) ? (++same_n, same) : (++other_n, other)) += distance(i, j);
  EXPECT_LT(same / same_n, 0.5 * other / other_n);
  EXPECT_NE(ErrorOf([] { ImageDataset::Synthetic(0, 3, 8, 4, 1); }).find("expected positive sizes"),
            std::string::npos);
}

TEST(ImageDataset, SplitsAreASeededPermutation) {
  const auto splits = SplitSamples("80,20,0", 100, 5);
  ASSERT_EQ(splits.size(), 3u);
  EXPECT_EQ(splits[0].size(), 80u);
  EXPECT_EQ(splits[1].size(), 20u);
  EXPECT_TRUE(splits[2].empty());
  std::vector<int64_t> all(splits[0]);
  all.insert(all.end(), splits[1].begin(), splits[1].end());
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(all[i], i);
  EXPECT_EQ(SplitSamples("80,20,0", 100, 5), splits);
  EXPECT_NE(SplitSamples("80,20,0", 100, 6), splits);
  EXPECT_NE(splits[0][0] + 1, splits[0][1]);  // shuffled, not in order (for this seed)
}

}  // namespace
}  // namespace tessel::zoo
