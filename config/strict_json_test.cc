#include "config/strict_json.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace config {
namespace {

TEST(ParseJsonRejectingDuplicatesTest, AcceptsValidJsonAndKeepsKeyOrder) {
  auto json = ParseJsonRejectingDuplicates(
      R"({"b": 1, "a": {"y": [1, 2, {"z": true}], "x": null}})", "t.json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->dump(), R"({"b":1,"a":{"y":[1,2,{"z":true}],"x":null}})");
}

TEST(ParseJsonRejectingDuplicatesTest, ReportsEveryDuplicateWithItsPath) {
  auto json = ParseJsonRejectingDuplicates(
      R"({"top": 1, "top": 2,
          "outer": {"inner": {"k": 1, "k": 2}},
          "list": [{"x": 1}, 7, {"x": 1, "x": 2}]})",
      "dup.json");
  ASSERT_FALSE(json.ok());
  const std::string message(json.status().message());
  EXPECT_NE(message.find("dup.json: duplicate key \"top\" at top"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("at outer.inner.k"), std::string::npos) << message;
  // The array's third element is index 2: scalars count as elements too.
  EXPECT_NE(message.find("at list[2].x"), std::string::npos) << message;
}

TEST(ParseJsonRejectingDuplicatesTest, SameKeyInDifferentObjectsIsFine) {
  auto json = ParseJsonRejectingDuplicates(
      R"({"a": {"stage": 1}, "b": {"stage": 2}, "stage": 3})", "t.json");
  EXPECT_TRUE(json.ok()) << json.status();
}

TEST(ParseJsonRejectingDuplicatesTest, MalformedJsonNamesSourceAndLine) {
  auto json = ParseJsonRejectingDuplicates("{\n  \"a\": 1,\n}\n", "bad.json");
  ASSERT_FALSE(json.ok());
  const std::string message(json.status().message());
  EXPECT_EQ(message.rfind("bad.json: invalid JSON", 0), 0u) << message;
  EXPECT_NE(message.find("line 3"), std::string::npos) << message;
}

TEST(EditDistanceTest, CountsInsertionsDeletionsSubstitutions) {
  EXPECT_EQ(EditDistance("", ""), 0);
  EXPECT_EQ(EditDistance("abc", ""), 3);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("stage3_prefetch_bucket_sise",
                         "stage3_prefetch_bucket_size"),
            1);
  EXPECT_EQ(EditDistance("flaw", "lawn"), 2);
}

TEST(StrictJsonTest, NumberOverflowingADoubleIsAnErrorNamingItsPath) {
  // nlohmann throws out_of_range (not parse_error) for these; uncaught, it
  // aborted the process.
  for (const auto& [text, path] :
       std::vector<std::pair<std::string, std::string>>{
           {R"({"a": {"b": 1e999}})", "at a.b "},
           {R"({"a": [1, 2, -1e400]})", "at a[2] "},
           {"1e999", "at the top level "}}) {
    absl::StatusOr<OrderedJson> parsed =
        ParseJsonRejectingDuplicates(text, "f.json");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(parsed.status().message());
    EXPECT_EQ(message.rfind("f.json: number out of range " + path, 0), 0u)
        << message;
  }
}

TEST(NearestCandidateTest, SuggestsOnlyPlausibleTypos) {
  const std::vector<std::string> keys = {"stage", "overlap_comm",
                                         "reduce_bucket_size"};
  EXPECT_EQ(NearestCandidate("stgae", keys), "stage");
  EXPECT_EQ(NearestCandidate("reduce_bucket_sz", keys), "reduce_bucket_size");
  EXPECT_EQ(NearestCandidate("completely_different", keys), "");
}

TEST(DescribeJsonValueTest, NamesKindAndValue) {
  EXPECT_EQ(DescribeJsonValue(OrderedJson("5e8")), "string \"5e8\"");
  EXPECT_EQ(DescribeJsonValue(OrderedJson(true)), "boolean true");
  EXPECT_EQ(DescribeJsonValue(OrderedJson(3.5)), "number 3.5");
  EXPECT_EQ(DescribeJsonValue(OrderedJson(nullptr)), "null");
  EXPECT_EQ(DescribeJsonValue(OrderedJson::array()), "an array");
}

}  // namespace
}  // namespace config
}  // namespace ze
