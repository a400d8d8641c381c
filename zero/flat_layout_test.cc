#include "zero/flat_layout.h"

#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace zero {
namespace {

std::vector<ParamSpec> Params(const std::vector<int64_t>& sizes) {
  std::vector<ParamSpec> params;
  for (size_t i = 0; i < sizes.size(); ++i) {
    params.push_back(ParamSpec{"p" + std::to_string(i), sizes[i]});
  }
  return params;
}

TEST(FlatLayoutTest, HandComputedThreeRanks) {
  // a=53 at 0, b=100 at 64 (53 rounded up to 16), c=7 at 176 (164 rounded
  // up); content 183. ceil(183 / 3) = 61 -> slice 128 (alignment), padded 384.
  LayoutOptions options;
  options.world_size = 3;
  auto layout =
      PartitionedLayout::Build({{"a", 53}, {"b", 100}, {"c", 7}}, options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->num_buckets(), 1);
  EXPECT_EQ(layout->placement(0).offset, 0);
  EXPECT_EQ(layout->placement(1).offset, 64);
  EXPECT_EQ(layout->placement(2).offset, 176);
  EXPECT_EQ(layout->bucket(0).content_elements, 183);
  EXPECT_EQ(layout->bucket(0).slice_elements, 128);
  EXPECT_EQ(layout->padded_total_elements(), 384);
  EXPECT_EQ(layout->partition_elements(), 128);
  EXPECT_EQ(layout->total_param_elements(), 160);
  EXPECT_EQ(layout->BucketSlice(0, 2), (PartitionSlice{2, 256, 384}));

  const std::vector<ParamShard> rank0 = layout->RankShards(0);
  ASSERT_EQ(rank0.size(), 2u);
  EXPECT_EQ(rank0[0], (ParamShard{0, 0, 0, 0, 53, 0, 0}));
  EXPECT_EQ(rank0[1], (ParamShard{1, 0, 0, 0, 64, 64, 64}));
  const std::vector<ParamShard> rank1 = layout->RankShards(1);
  ASSERT_EQ(rank1.size(), 2u);
  EXPECT_EQ(rank1[0], (ParamShard{1, 1, 0, 64, 36, 128, 0}));
  EXPECT_EQ(rank1[1], (ParamShard{2, 1, 0, 0, 7, 176, 48}));
  EXPECT_TRUE(layout->RankShards(2).empty());

  const std::vector<ParamShard> b_pieces = layout->LocateParamRange(1, 10, 90);
  ASSERT_EQ(b_pieces.size(), 2u);
  EXPECT_EQ(b_pieces[0], (ParamShard{1, 0, 0, 10, 54, 74, 74}));
  EXPECT_EQ(b_pieces[1], (ParamShard{1, 1, 0, 64, 26, 128, 0}));
}

// Every element of every parameter is owned by exactly one rank, slices are
// equal and aligned, and RankShards agrees with LocateParamRange: for odd and
// even world sizes, odd parameter sizes, with and without bucketing.
TEST(FlatLayoutTest, OwnershipIsAnExactCoverForManyShapes) {
  std::mt19937 rng(7);
  for (int world_size : {1, 2, 3, 4, 5, 7, 8}) {
    for (int64_t bucket_max : {int64_t{0}, int64_t{300}, int64_t{1000}}) {
      std::vector<int64_t> sizes = {53, 1, 0, 1024, 129, 7, 2048, 53};
      for (int i = 0; i < 12; ++i) sizes.push_back(1 + rng() % 700);
      LayoutOptions options;
      options.world_size = world_size;
      options.bucket_max_elements = bucket_max;
      auto layout = PartitionedLayout::Build(Params(sizes), options);
      ASSERT_TRUE(layout.ok()) << layout.status();

      int64_t slices_total = 0;
      for (int b = 0; b < layout->num_buckets(); ++b) {
        const BucketLayout& bucket = layout->bucket(b);
        EXPECT_EQ(bucket.slice_elements % kDefaultSliceAlignment, 0);
        EXPECT_EQ(bucket.padded_elements, bucket.slice_elements * world_size);
        EXPECT_GE(bucket.padded_elements, bucket.content_elements);
        EXPECT_EQ(bucket.partition_offset, slices_total);
        slices_total += bucket.slice_elements;
        if (bucket_max > 0 && bucket.end_param - bucket.first_param > 1) {
          EXPECT_LE(bucket.content_elements, bucket_max);
        }
      }
      EXPECT_EQ(layout->partition_elements(), slices_total);

      // owner[param][element] = rank, built from RankShards.
      std::vector<std::vector<int>> owner(sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) owner[i].assign(sizes[i], -1);
      for (int rank = 0; rank < world_size; ++rank) {
        int64_t last_partition_end = 0;
        for (const ParamShard& shard : layout->RankShards(rank)) {
          EXPECT_EQ(shard.rank, rank);
          EXPECT_GT(shard.count, 0);
          // Shards come in partition order and never overlap.
          EXPECT_GE(shard.partition_offset, last_partition_end);
          last_partition_end = shard.partition_offset + shard.count;
          EXPECT_LE(last_partition_end, layout->partition_elements());
          const PartitionSlice slice = layout->BucketSlice(shard.bucket, rank);
          EXPECT_TRUE(slice.Contains(shard.bucket_offset));
          EXPECT_LE(shard.bucket_offset + shard.count, slice.end);
          EXPECT_EQ(shard.partition_offset,
                    layout->bucket(shard.bucket).partition_offset +
                        shard.bucket_offset - slice.begin);
          const ParamPlacement& place = layout->placement(shard.param_index);
          EXPECT_EQ(place.offset % kDefaultParamAlignment, 0);
          EXPECT_EQ(shard.bucket_offset, place.offset + shard.param_begin);
          for (int64_t e = 0; e < shard.count; ++e) {
            int& who = owner[shard.param_index][shard.param_begin + e];
            EXPECT_EQ(who, -1) << "element owned twice";
            who = rank;
          }
        }
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        for (int64_t e = 0; e < sizes[i]; ++e) {
          ASSERT_NE(owner[i][e], -1) << "param " << i << " element " << e;
        }
        // LocateParamRange of the whole parameter finds the same owners.
        int64_t covered = 0;
        for (const ParamShard& piece :
             layout->LocateParamRange(static_cast<int>(i), 0, sizes[i])) {
          EXPECT_EQ(piece.param_begin, covered);
          for (int64_t e = 0; e < piece.count; ++e) {
            EXPECT_EQ(owner[i][piece.param_begin + e], piece.rank);
          }
          covered += piece.count;
        }
        EXPECT_EQ(covered, sizes[i]);
      }
    }
  }
}

TEST(FlatLayoutTest, BucketingIsGreedyAndGivesLargeParamsTheirOwnBucket) {
  LayoutOptions options;
  options.world_size = 2;
  options.bucket_max_elements = 100;
  options.param_alignment = 1;
  // 40+50 fit; +20 would be 110 -> new bucket; 500 alone; 30+60 fit.
  auto layout =
      PartitionedLayout::Build(Params({40, 50, 20, 500, 30, 60}), options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->num_buckets(), 4);
  EXPECT_EQ(layout->bucket(0).first_param, 0);
  EXPECT_EQ(layout->bucket(0).end_param, 2);
  EXPECT_EQ(layout->bucket(1).first_param, 2);
  EXPECT_EQ(layout->bucket(1).end_param, 3);
  EXPECT_EQ(layout->bucket(2).first_param, 3);
  EXPECT_EQ(layout->bucket(2).end_param, 4);
  EXPECT_EQ(layout->bucket(3).first_param, 4);
  EXPECT_EQ(layout->bucket(3).end_param, 6);
  // 500 over 2 ranks = 250 -> 256 per slice.
  EXPECT_EQ(layout->bucket(2).slice_elements, 256);
  EXPECT_EQ(layout->placement(3).bucket, 2);
  EXPECT_EQ(layout->placement(3).offset, 0);
}

// The stage-2 claim: reduce-scattering each bucket buffer in equal chunks
// lands every rank's reduced gradients contiguously in its partition, at the
// positions RankShards promises.
TEST(FlatLayoutTest, PerBucketReduceScatterFillsContiguousPartitions) {
  const int world_size = 3;
  LayoutOptions options;
  options.world_size = world_size;
  options.bucket_max_elements = 400;
  const std::vector<int64_t> sizes = {53, 300, 17, 900, 64, 5};
  auto layout = PartitionedLayout::Build(Params(sizes), options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_GT(layout->num_buckets(), 2);

  // grads[rank][param][element]: what each rank's backward produced.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<std::vector<std::vector<float>>> grads(world_size);
  for (auto& per_rank : grads) {
    for (int64_t n : sizes) {
      std::vector<float> g(n);
      for (float& x : g) x = dist(rng);
      per_rank.push_back(g);
    }
  }
  // Each rank's partition after every bucket's reduce-scatter.
  std::vector<std::vector<float>> partitions(
      world_size, std::vector<float>(layout->partition_elements(), 0.0f));
  for (int b = 0; b < layout->num_buckets(); ++b) {
    const BucketLayout& bucket = layout->bucket(b);
    std::vector<float> reduced(bucket.padded_elements, 0.0f);
    for (int rank = 0; rank < world_size; ++rank) {
      // The rank fills its bucket buffer (padding stays zero) ...
      std::vector<float> buffer(bucket.padded_elements, 0.0f);
      for (int i = bucket.first_param; i < bucket.end_param; ++i) {
        for (int64_t e = 0; e < sizes[i]; ++e) {
          buffer[layout->placement(i).offset + e] = grads[rank][i][e];
        }
      }
      for (int64_t e = 0; e < bucket.padded_elements; ++e) {
        reduced[e] += buffer[e];
      }
    }
    // ... and reduce-scatter hands chunk r (slice_elements long) to rank r.
    for (int rank = 0; rank < world_size; ++rank) {
      for (int64_t e = 0; e < bucket.slice_elements; ++e) {
        partitions[rank][bucket.partition_offset + e] =
            reduced[rank * bucket.slice_elements + e];
      }
    }
  }
  int64_t owned = 0;
  for (int rank = 0; rank < world_size; ++rank) {
    for (const ParamShard& shard : layout->RankShards(rank)) {
      for (int64_t e = 0; e < shard.count; ++e) {
        float expected = 0.0f;
        for (int r = 0; r < world_size; ++r) {
          expected += grads[r][shard.param_index][shard.param_begin + e];
        }
        ASSERT_EQ(partitions[rank][shard.partition_offset + e], expected);
      }
      owned += shard.count;
    }
  }
  EXPECT_EQ(owned, layout->total_param_elements());
}

TEST(FlatLayoutTest, GroupsBecomeBucketsWhateverTheirSize) {
  LayoutOptions options;
  options.world_size = 4;
  options.bucket_max_elements = 10;  // ignored by BuildFromGroups
  auto layout = PartitionedLayout::BuildFromGroups(
      {{{"attn.w", 4096}, {"attn.b", 64}}, {}, {{"mlp.w", 53}}}, options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->num_buckets(), 2);
  EXPECT_EQ(layout->bucket(1).first_param, 2);
  EXPECT_EQ(*layout->FindParam("mlp.w"), 2);
  EXPECT_EQ(layout->FindParam("nope").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(layout->RankPartition(3).begin, 3 * layout->partition_elements());
}

TEST(FlatLayoutTest, RejectsBadInput) {
  LayoutOptions options;
  options.world_size = 0;
  EXPECT_EQ(PartitionedLayout::Build(Params({1}), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.world_size = 2;
  auto duplicate = PartitionedLayout::Build({{"w", 3}, {"w", 4}}, options);
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(duplicate.status().message().find("'w'"), std::string::npos);
  auto negative = PartitionedLayout::Build({{"w", -3}}, options);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  options.slice_alignment = 0;
  EXPECT_FALSE(PartitionedLayout::Build(Params({1}), options).ok());
}

TEST(FlatLayoutTest, EmptyListGivesEmptyLayout) {
  auto layout = PartitionedLayout::Build({}, LayoutOptions{});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->num_buckets(), 0);
  EXPECT_EQ(layout->partition_elements(), 0);
  EXPECT_TRUE(layout->RankShards(0).empty());
}

}  // namespace
}  // namespace zero
}  // namespace ze
