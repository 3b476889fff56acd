#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "core/npy.h"

namespace kiln {
namespace {

TEST(Npy, RoundTripsEveryType) {
  const auto path = (std::filesystem::temp_directory_path() / "kiln_test.npy").string();
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kInt8,
                     DataType::kUInt8, DataType::kInt32, DataType::kInt64, DataType::kBool}) {
    Tensor a = Tensor::from<float>({2, 3}, {1, 0, 3, 4, 5, 6}).cast(t);
    ASSERT_TRUE(write_npy(path, a).ok());
    auto b = read_npy(path);
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_EQ(b->dtype(), t);
    EXPECT_EQ(b->shape(), a.shape());
    for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.at_double(i), b->at_double(i));
  }
  Tensor s = Tensor::scalar<float>(2.5f);
  ASSERT_TRUE(write_npy(path, s).ok());
  auto r = read_npy(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rank(), 0);
  EXPECT_EQ(r->at_double(0), 2.5);
  std::remove(path.c_str());
}

TEST(Npy, TruncatedFileIsRefused) {
  const auto path = (std::filesystem::temp_directory_path() / "kiln_trunc.npy").string();
  Tensor a(DataType::kFloat32, {100});
  ASSERT_TRUE(write_npy(path, a).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 8);
  auto r = read_npy(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kiln
