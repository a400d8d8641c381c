#include "zero/bucket_binding.h"

#include <memory>
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/init.h"
#include "nn/parameter.h"

namespace ze {
namespace zero {
namespace {

// Two buckets: {a [2,3], b [5]} and {c [4]}; a at 0, b at 16 (alignment).
class BucketBindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<Shape> shapes = {{2, 3}, {5}, {4}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      owned_.push_back(std::make_unique<nn::Parameter>(
          nullptr, "p" + std::to_string(i), shapes[i], DType::kF32,
          Device::Cpu(), nn::Initializer::Zeros()));
      params_.push_back(owned_.back().get());
    }
    absl::StatusOr<PartitionedLayout> layout =
        PartitionedLayout::BuildFromGroups(
            {{{"p0", 6}, {"p1", 5}}, {{"p2", 4}}}, LayoutOptions());
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = *layout;
  }

  Tensor Buffer(int bucket) const {
    return Tensor::Zeros({layout_.bucket(bucket).padded_elements}, DType::kF32,
                         Device::Cpu())
        .value();
  }

  std::vector<std::unique_ptr<nn::Parameter>> owned_;
  std::vector<nn::Parameter*> params_;
  PartitionedLayout layout_;
};

TEST_F(BucketBindingTest, DataSlotsAreShapedViewsAtTheLayoutOffsets) {
  const Tensor buffer = Buffer(0);
  ASSERT_TRUE(
      BindBucket(layout_, 0, params_, ParameterSlot::kData, buffer).ok());
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Tensor> data = params_[i]->data();
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->shape(), params_[i]->shape());
    // A view, not a copy: the same bytes as the parameter's slice.
    EXPECT_EQ(data->data(),
              buffer.data_as<float>() + layout_.placement(i).offset);
  }
  EXPECT_EQ(layout_.placement(1).offset, 16);
  // The other bucket's parameter is untouched.
  EXPECT_FALSE(params_[2]->data().ok());
  // Writes through the buffer are what the layers read.
  buffer.data_as<float>()[16 + 4] = 7.0f;
  EXPECT_EQ(params_[1]->data()->data_as<float>()[4], 7.0f);
}

TEST_F(BucketBindingTest, GradSlotsBindAndUndefinedBufferEmpties) {
  const Tensor buffer = Buffer(1);
  ASSERT_TRUE(
      BindBucket(layout_, 1, params_, ParameterSlot::kGrad, buffer).ok());
  EXPECT_EQ(params_[2]->grad().data(), buffer.data());
  EXPECT_EQ(params_[2]->grad().shape(), params_[2]->shape());
  EXPECT_FALSE(params_[2]->data().ok());  // only the grad slot was bound

  ASSERT_TRUE(
      BindBucket(layout_, 1, params_, ParameterSlot::kGrad, Tensor()).ok());
  EXPECT_FALSE(params_[2]->grad().defined());

  ASSERT_TRUE(
      BindBucket(layout_, 0, params_, ParameterSlot::kData, Buffer(0)).ok());
  ASSERT_TRUE(
      BindBucket(layout_, 0, params_, ParameterSlot::kData, Tensor()).ok());
  EXPECT_FALSE(params_[0]->data().ok());
  EXPECT_FALSE(params_[1]->data().ok());
}

TEST_F(BucketBindingTest, ShortBufferIsRefusedNamingTheBucket) {
  const Tensor short_buffer =
      Tensor::Zeros({10}, DType::kF32, Device::Cpu()).value();
  const absl::Status status =
      BindBucket(layout_, 0, params_, ParameterSlot::kData, short_buffer);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bucket 0"), std::string::npos) << status;
  EXPECT_FALSE(params_[0]->data().ok());
}

TEST_F(BucketBindingTest, WrongDtypeFailsFromTheParameter) {
  const Tensor bf16 = Tensor::Zeros({layout_.bucket(0).padded_elements},
                                    DType::kBF16, Device::Cpu())
                          .value();
  EXPECT_EQ(BindBucket(layout_, 0, params_, ParameterSlot::kData, bf16).code(),
            absl::StatusCode::kInvalidArgument);
}

// A rank's slice [8, 20) of bucket 0 (p0 at [0, 6), p1 at [16, 21)): p1's
// elements 0-3 are in it, p0 has none there.
TEST_F(BucketBindingTest, ShardSlotsAreThePiecesInTheSlice) {
  const Tensor slice = Tensor::Zeros({12}, DType::kF32, Device::Cpu()).value();
  ASSERT_TRUE(params_[0]->SetShard(Buffer(1).Slice(0, 2), 0).ok());
  ASSERT_TRUE(BindBucket(layout_, 0, params_, ParameterSlot::kShard, slice,
                         /*buffer_begin=*/8)
                  .ok());
  EXPECT_FALSE(params_[0]->shard().ok());  // emptied: nothing in the slice
  absl::StatusOr<Tensor> shard = params_[1]->shard();
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->numel(), 4);
  EXPECT_EQ(params_[1]->shard_offset(), 0);
  EXPECT_EQ(shard->data(), slice.data_as<float>() + 8);  // a view
  EXPECT_FALSE(params_[1]->data().ok());  // only the shard slot was bound

  ASSERT_TRUE(
      BindBucket(layout_, 0, params_, ParameterSlot::kShard, Tensor()).ok());
  EXPECT_FALSE(params_[1]->shard().ok());
}

TEST_F(BucketBindingTest, WholeBucketSlotRefusesAnOffsetBuffer) {
  const absl::Status status = BindBucket(
      layout_, 0, params_, ParameterSlot::kData, Buffer(0), /*buffer_begin=*/4);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bucket 0"), std::string::npos) << status;
}

TEST(ParameterViewTest, SlicesThePlacementAndReshapes) {
  absl::StatusOr<PartitionedLayout> layout =
      PartitionedLayout::Build({{"a", 3}, {"b", 6}}, LayoutOptions());
  ASSERT_TRUE(layout.ok());
  const Tensor buffer = Tensor::Zeros({layout->bucket(0).padded_elements},
                                      DType::kF32, Device::Cpu())
                            .value();
  const Tensor view = ParameterView(*layout, 1, buffer, {2, 3});
  EXPECT_EQ(view.shape(), (Shape{2, 3}));
  EXPECT_EQ(view.data(), buffer.data_as<float>() + layout->placement(1).offset);
}

}  // namespace
}  // namespace zero
}  // namespace ze
