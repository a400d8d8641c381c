// Tests of the safetensors writer and reader: round trips, ranged reads,
// atomic writes under failure, and one rejection test per malformed-file
// case the reader must catch (each builds the bad bytes by hand).
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/safetensors/file_io.h"
#include "core/safetensors/format.h"
#include "core/safetensors/reader.h"
#include "core/safetensors/writer.h"
#include "core/status.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace ze {
namespace safetensors {
namespace {

// A fresh directory per test so tests never see each other's files.
std::string MakeTestDirectory() {
  const ::testing::TestInfo *info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string directory =
      absl::StrCat(::testing::TempDir(), "/", info->name());
  mkdir(directory.c_str(), 0755);
  return directory;
}

std::string ReadWholeFile(const std::string &path) {
  std::ifstream stream(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(stream), {});
}

void WriteWholeFile(const std::string &path, const std::string &bytes) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LittleEndian64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
  return bytes;
}

// A file with the given header text (length computed from it unless
// `claimed_length` is given) followed by `data_bytes` bytes of data.
std::string RawFile(const std::string &header, size_t data_bytes,
                    int64_t claimed_length = -1) {
  const uint64_t length = claimed_length >= 0
                              ? static_cast<uint64_t>(claimed_length)
                              : header.size();
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i);
  return LittleEndian64(length) + header + data;
}

// Lists the directory's entries (to prove no temporary file is left).
std::vector<std::string> ListDirectory(const std::string &directory) {
  std::vector<std::string> names;
  DIR *dir = opendir(directory.c_str());
  if (dir == nullptr) return names;
  while (dirent *entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

Tensor MakeTensor(const Shape &shape, DType dtype, float scale) {
  Tensor tensor = Tensor::Empty(shape, dtype, Device::Cpu()).value();
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    if (dtype == DType::kI32) {
      tensor.data_as<int32_t>()[i] = static_cast<int32_t>(i * 7 - 20);
    } else {
      StoreFromFloat(tensor.data(), dtype, i, scale * (i - 2.5f));
    }
  }
  return tensor;
}

std::string Bytes(const Tensor &tensor) {
  return std::string(static_cast<const char *>(tensor.data()), tensor.nbytes());
}

class RejectionTest : public ::testing::Test {
 protected:
  // Writes `bytes` to a file, opens it and expects `code` with a message
  // naming the file and containing `expected_text`.
  void ExpectRejected(const std::string &bytes, absl::StatusCode code,
                      const std::string &expected_text) {
    const std::string path = MakeTestDirectory() + "/bad.safetensors";
    WriteWholeFile(path, bytes);
    absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
    ASSERT_FALSE(reader.ok()) << "accepted a malformed file";
    EXPECT_EQ(reader.status().code(), code) << reader.status();
    EXPECT_TRUE(absl::StrContains(reader.status().message(), path))
        << reader.status();
    EXPECT_TRUE(absl::StrContains(reader.status().message(), expected_text))
        << reader.status() << "\nexpected to contain: " << expected_text;
  }
};

constexpr char kGoodEntry[] =
    R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";

TEST_F(RejectionTest, AcceptsTheWellFormedBaselineOfTheseTests) {
  const std::string path = MakeTestDirectory() + "/good.safetensors";
  WriteWholeFile(path, RawFile(absl::StrCat("{", kGoodEntry, "}"), 16));
  ASSERT_TRUE(Reader::Open(path).ok()) << Reader::Open(path).status();
}

TEST_F(RejectionTest, HeaderOver100MB) {
  // The length alone must be rejected, before any allocation for it.
  ExpectRejected(RawFile("{}", 0, kMaxHeaderBytes + 1),
                 absl::StatusCode::kInvalidArgument, "over the format's limit");
}

TEST_F(RejectionTest, FileShorterThanTheLength) {
  ExpectRejected(std::string("\x02\0\0", 3), absl::StatusCode::kDataLoss,
                 "too short for the 8-byte");
}

TEST_F(RejectionTest, TruncatedHeader) {
  const std::string header = absl::StrCat("{", kGoodEntry, "}");
  ExpectRejected(RawFile(header, 0, header.size() + 100),
                 absl::StatusCode::kDataLoss, "truncated safetensors header");
}

TEST_F(RejectionTest, HeaderNotJson) {
  ExpectRejected(RawFile("{\"a\": nonsense}", 0),
                 absl::StatusCode::kInvalidArgument, "not valid JSON");
}

TEST_F(RejectionTest, HeaderWithGarbageAfterTheObject) {
  ExpectRejected(RawFile("{}  x", 0), absl::StatusCode::kInvalidArgument,
                 "not valid JSON");
}

TEST_F(RejectionTest, HeaderNotUtf8) {
  ExpectRejected(RawFile("{\"__metadata__\":{\"k\":\"\xff\xfe\"}}", 0),
                 absl::StatusCode::kInvalidArgument, "not valid JSON");
}

TEST_F(RejectionTest, HeaderNotAnObject) {
  ExpectRejected(RawFile("[1, 2, 3]", 0), absl::StatusCode::kInvalidArgument,
                 "does not start with '{'");
}

TEST_F(RejectionTest, DuplicateTensorName) {
  ExpectRejected(
      RawFile(
          absl::StrCat(
              "{", kGoodEntry,
              R"(,"a":{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]}})"),
          32),
      absl::StatusCode::kInvalidArgument, "duplicate key \"a\"");
}

TEST_F(RejectionTest, DuplicateFieldInsideAnEntry) {
  ExpectRejected(
      RawFile(
          R"({"a":{"dtype":"F32","dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})",
          16),
      absl::StatusCode::kInvalidArgument, "duplicate key \"dtype\"");
}

TEST_F(RejectionTest, UnknownDtype) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", 8),
      absl::StatusCode::kInvalidArgument,
      "unknown or unsupported dtype \"F12\"");
}

TEST_F(RejectionTest, LowercaseDtypeIsUnknownLikeTheReference) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8),
      absl::StatusCode::kInvalidArgument, "unknown or unsupported dtype");
}

TEST_F(RejectionTest, OffsetsNotStartingAtZero) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
      absl::StatusCode::kInvalidArgument, "starts at byte 4, not 0");
}

TEST_F(RejectionTest, OverlappingOffsets) {
  ExpectRejected(
      RawFile(absl::StrCat(
                  "{", kGoodEntry,
                  R"(,"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})"),
              24),
      absl::StatusCode::kInvalidArgument, "overlaps tensor \"a\"");
}

TEST_F(RejectionTest, OffsetsLeavingAGap) {
  ExpectRejected(
      RawFile(
          absl::StrCat(
              "{", kGoodEntry,
              R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[20,24]}})"),
          24),
      absl::StatusCode::kInvalidArgument, "leaving a gap after tensor \"a\"");
}

TEST_F(RejectionTest, OffsetsEndingBeforeTheyBegin) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
      absl::StatusCode::kInvalidArgument, "end before they begin");
}

TEST_F(RejectionTest, OffsetsNotAPair) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", 8),
      absl::StatusCode::kInvalidArgument,
      "\"data_offsets\" must be [begin, end]");
}

TEST_F(RejectionTest, SizeDisagreesWithDtypeTimesShape) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
              12),
      absl::StatusCode::kInvalidArgument,
      "span 12 bytes but F32 x [2, 2] needs 16");
}

TEST_F(RejectionTest, ShapeThatOverflows) {
  ExpectRejected(
      RawFile(
          R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
          8),
      absl::StatusCode::kInvalidArgument, "overflows 64 bits");
}

TEST_F(RejectionTest, NegativeDimension) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
      absl::StatusCode::kInvalidArgument, "is not a non-negative integer");
}

TEST_F(RejectionTest, EntryWithoutShape) {
  ExpectRejected(RawFile(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8),
                 absl::StatusCode::kInvalidArgument,
                 "missing or non-array \"shape\"");
}

TEST_F(RejectionTest, EntryNotAnObject) {
  ExpectRejected(RawFile(R"({"a":[1,2]})", 0),
                 absl::StatusCode::kInvalidArgument, "not an object");
}

TEST_F(RejectionTest, DataShorterThanTheHeaderSays) {
  ExpectRejected(RawFile(absl::StrCat("{", kGoodEntry, "}"), 12),
                 absl::StatusCode::kDataLoss, "(file truncated)");
}

TEST_F(RejectionTest, TrailingBytesAfterTheData) {
  ExpectRejected(RawFile(absl::StrCat("{", kGoodEntry, "}"), 20),
                 absl::StatusCode::kDataLoss,
                 "(trailing bytes after the data)");
}

TEST_F(RejectionTest, NonStringMetadataValue) {
  ExpectRejected(RawFile(R"({"__metadata__":{"step":7}})", 0),
                 absl::StatusCode::kInvalidArgument,
                 "metadata value for key \"step\"");
}

TEST_F(RejectionTest, MetadataNotAnObject) {
  ExpectRejected(RawFile(R"({"__metadata__":"pt"})", 0),
                 absl::StatusCode::kInvalidArgument,
                 "\"__metadata__\" is a JSON string, not an object");
}

TEST(ReaderTest, AcceptsEntriesListedOutOfDataOrderAndUnpaddedHeaders) {
  // Files from other writers list tensors in any order (the reference sorts
  // by dtype, older versions by name) and need not pad the header.
  const std::string path = MakeTestDirectory() + "/unordered.safetensors";
  WriteWholeFile(
      path,
      RawFile(
          R"({"b":{"dtype":"I32","shape":[1],"data_offsets":[16,20]},)"
          R"("e":{"dtype":"F16","shape":[0,5],"data_offsets":[16,16]},)"
          R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16],"extra":1}})",
          20));
  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->tensors().size(), 3u);
  EXPECT_EQ((*reader)->tensors()[0].name, "a");
  // Sorted by (begin, end), as the reference does: the empty "e" at 16
  // comes before "b" which also starts at 16.
  EXPECT_EQ((*reader)->tensors()[1].name, "e");
  EXPECT_EQ((*reader)->tensors()[2].name, "b");
  EXPECT_TRUE((*reader)->metadata().empty());
}

TEST(ReaderTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = MakeTestDirectory() + "/absent.safetensors";
  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(reader.status().message(), path));
}

TEST(ReaderTest, ReadsRawBytesOfTypesWithoutAZeDType) {
  // F64, I64 and BOOL appear in Hugging Face files; they are listed and
  // readable as bytes even though ze has no tensors of them.
  const std::string path = MakeTestDirectory() + "/hf_types.safetensors";
  WriteWholeFile(
      path,
      RawFile(R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
              R"("l":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)"
              R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}})",
              19));
  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->Find("d")->dtype, ElementType::kF64);
  EXPECT_EQ((*reader)->Find("m")->dtype, ElementType::kBool);
  unsigned char mask[3] = {};
  ASSERT_TRUE((*reader)->ReadBytes("m", 0, 3, mask).ok());
  // RawFile fills data byte i with the value i.
  EXPECT_EQ(mask[0], 16);
  EXPECT_EQ(mask[2], 18);
  absl::StatusOr<Tensor> as_tensor = (*reader)->ReadTensor("d");
  EXPECT_EQ(as_tensor.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(RoundTripTest, SeveralDtypesShapesScalarsEmptiesAndMetadata) {
  const std::string path = MakeTestDirectory() + "/round.safetensors";
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"blocks.0.w", MakeTensor({2, 3}, DType::kF32, 0.5f)},
      {"blocks.0.b", MakeTensor({4}, DType::kBF16, 1.25f)},
      {"half", MakeTensor({3, 1, 2}, DType::kF16, -0.75f)},
      {"ids", MakeTensor({5}, DType::kI32, 1.0f)},
      {"scalar", MakeTensor({}, DType::kF32, 3.0f)},
      {"empty", MakeTensor({0, 3}, DType::kF32, 1.0f)},
      {"empty_bf16", MakeTensor({2, 0}, DType::kBF16, 1.0f)},
  };
  const Metadata metadata = {{"format", "pt"}, {"step", "7"}};
  const absl::Status written = WriteFile(path, tensors, metadata);
  ASSERT_TRUE(written.ok()) << written;

  // The header is padded so the data starts 8-byte aligned.
  const std::string bytes = ReadWholeFile(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);

  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata(), metadata);
  EXPECT_EQ((*reader)->data_start(), 8 + header_length);
  ASSERT_EQ((*reader)->tensors().size(), tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto &[name, expected] = tensors[i];
    const TensorInfo &info = (*reader)->tensors()[i];
    EXPECT_EQ(info.name, name) << "file order must be declaration order";
    EXPECT_EQ(info.shape, expected.shape()) << name;
    EXPECT_EQ(info.dtype, ElementTypeOf(expected.dtype())) << name;
    EXPECT_EQ(info.begin, offset) << name;
    offset += expected.nbytes();
    absl::StatusOr<Tensor> read = (*reader)->ReadTensor(name);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->shape(), expected.shape()) << name;
    EXPECT_EQ(read->dtype(), expected.dtype()) << name;
    EXPECT_EQ(Bytes(*read), Bytes(expected)) << name;
  }
  EXPECT_EQ(bytes.size(), 8 + header_length + offset);
}

TEST(RoundTripTest, EmptyFileHasTheReferenceBytes) {
  // The reference writer produces exactly these 16 bytes for no tensors.
  const std::string path = MakeTestDirectory() + "/empty.safetensors";
  ASSERT_TRUE(WriteFile(path, {}).ok());
  EXPECT_EQ(ReadWholeFile(path), LittleEndian64(8) + "{}      ");
  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->tensors().empty());
}

TEST(WriterTest, ChecksumCoversEveryByteOfTheFinishedFile) {
  const std::string path = MakeTestDirectory() + "/crc.safetensors";
  // Big enough that some appends bypass the writer's batching buffer.
  Tensor big = MakeTensor({600000}, DType::kF32, 0.5f);
  Tensor small = MakeTensor({3}, DType::kBF16, 2.0f);
  absl::StatusOr<std::unique_ptr<Writer>> writer =
      Writer::Create(path, {{"small", ElementType::kBF16, {3}},
                            {"big", ElementType::kF32, {600000}}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append("small", small).ok());
  ASSERT_TRUE((*writer)->Append("big", big.Slice(0, 7)).ok());
  ASSERT_TRUE((*writer)->Append("big", big.Slice(7, 600000 - 7)).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  const std::string bytes = ReadWholeFile(path);
  EXPECT_EQ((*writer)->bytes_written(), bytes.size());
  EXPECT_EQ((*writer)->crc32c(), Crc32c(bytes.data(), bytes.size()));
}

// Direct I/O writes the same bytes as buffered writes: several 32 MiB
// blocks (one filled across appends), a partial last block whose tail is
// not a multiple of 4096 bytes, the same CRC. (On a file system without
// O_DIRECT the writer falls back to buffered writes; the bytes still agree.)
TEST(WriterTest, DirectIoWritesTheSameFile) {
  const std::string directory = MakeTestDirectory();
  const int64_t count = (int64_t{70} << 20) / 4 + 12345;  // ~70 MiB of f32
  Tensor big = MakeTensor({count}, DType::kF32, 0.25f);
  Tensor small = MakeTensor({5}, DType::kBF16, 3.0f);
  std::string contents[2];
  uint32_t crcs[2] = {0, 0};
  for (int direct = 0; direct < 2; ++direct) {
    const std::string path =
        absl::StrCat(directory, "/direct", direct, ".safetensors");
    WriterOptions options;
    options.direct_io = direct == 1;
    absl::StatusOr<std::unique_ptr<Writer>> writer =
        Writer::Create(path,
                       {{"small", ElementType::kBF16, {5}},
                        {"big", ElementType::kF32, {count}}},
                       {}, options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append("small", small).ok());
    ASSERT_TRUE((*writer)->Append("big", big.Slice(0, 1000)).ok());
    ASSERT_TRUE((*writer)->Append("big", big.Slice(1000, count - 1000)).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
    if (direct == 1) {
      std::printf("direct I/O used: %d\n", (*writer)->stats().direct_io);
    }
    contents[direct] = ReadWholeFile(path);
    crcs[direct] = (*writer)->crc32c();
    EXPECT_EQ((*writer)->bytes_written(), contents[direct].size());
    EXPECT_EQ(crcs[direct],
              Crc32c(contents[direct].data(), contents[direct].size()));
    // No temporary file is left behind.
    int entries = 0;
    DIR *listing = opendir(directory.c_str());
    while (dirent *entry = readdir(listing)) {
      if (absl::StrContains(entry->d_name, ".tmp.")) ++entries;
    }
    closedir(listing);
    EXPECT_EQ(entries, 0);
  }
  EXPECT_EQ(contents[0], contents[1]);
  EXPECT_EQ(crcs[0], crcs[1]);
}

TEST(WriterTest, StreamsChunksFromSlicesOfABiggerBuffer) {
  const std::string path = MakeTestDirectory() + "/stream.safetensors";
  // One flat buffer holding two parameters back to back, written in uneven
  // chunks, as a rank holding shards would.
  Tensor flat = MakeTensor({10}, DType::kF32, 1.0f);
  absl::StatusOr<std::unique_ptr<Writer>> writer =
      Writer::Create(path, {{"first", ElementType::kF32, {2, 3}},
                            {"nothing", ElementType::kF32, {0}},
                            {"second", ElementType::kF32, {4}}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append("first", flat.Slice(0, 4)).ok());
  // Out of order: "second" before "first" is complete.
  absl::Status out_of_order = (*writer)->Append("second", flat.Slice(6, 4));
  EXPECT_EQ(out_of_order.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(out_of_order.message(), "expected data for \"first\""));
  // Too many elements for what "first" lacks.
  EXPECT_EQ((*writer)->Append("first", flat.Slice(4, 3)).code(),
            absl::StatusCode::kInvalidArgument);
  // Wrong dtype.
  EXPECT_EQ(
      (*writer)->Append("first", MakeTensor({2}, DType::kBF16, 1.0f)).code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*writer)->Append("first", flat.Slice(4, 2)).ok());
  // Zero-size "nothing" is complete without an append; Finish early fails
  // without spoiling the writer.
  EXPECT_EQ((*writer)->Finish().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*writer)->Append("second", flat.Slice(6, 1)).ok());
  ASSERT_TRUE((*writer)->Append("second", flat.Slice(7, 3)).ok());
  ASSERT_TRUE((*writer)->Finish().ok());

  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(Bytes((*reader)->ReadTensor("first").value()),
            Bytes(flat.Slice(0, 6)));
  EXPECT_EQ(Bytes((*reader)->ReadTensor("second").value()),
            Bytes(flat.Slice(6, 4)));
  EXPECT_EQ(ListDirectory(MakeTestDirectory()).size(), 1u);
}

TEST(WriterTest, RejectsBadDeclarations) {
  const std::string path = MakeTestDirectory() + "/bad.safetensors";
  EXPECT_EQ(Writer::Create(path, {{"a", ElementType::kF32, {1}},
                                  {"a", ElementType::kF32, {1}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Writer::Create(path, {{"__metadata__", ElementType::kF32, {1}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Writer::Create(path, {{"n", ElementType::kF32, {-1}}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListDirectory(MakeTestDirectory()).empty());
}

TEST(RangedReadTest, ReadsAnyElementRangeAndOnlyItsBytes) {
  const std::string path = MakeTestDirectory() + "/ranged.safetensors";
  Tensor first = MakeTensor({4, 5}, DType::kBF16, 0.25f);
  Tensor last = MakeTensor({3}, DType::kF32, 2.0f);
  ASSERT_TRUE(WriteFile(path, {{"first", first}, {"last", last}}).ok());
  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();

  // A rank's slice: elements [7, 7 + 6), into a flat destination.
  Tensor slice = Tensor::Empty({6}, DType::kBF16, Device::Cpu()).value();
  ASSERT_TRUE((*reader)->ReadRange("first", 7, 6, slice).ok());
  EXPECT_EQ(Bytes(slice), Bytes(first.Slice(7, 6)));
  // The last element alone, and an empty range at the end.
  Tensor one = Tensor::Empty({1}, DType::kBF16, Device::Cpu()).value();
  ASSERT_TRUE((*reader)->ReadRange("first", 19, 1, one).ok());
  EXPECT_EQ(Bytes(one), Bytes(first.Slice(19, 1)));
  Tensor none = Tensor::Empty({0}, DType::kBF16, Device::Cpu()).value();
  EXPECT_TRUE((*reader)->ReadRange("first", 20, 0, none).ok());

  EXPECT_EQ((*reader)->ReadRange("first", 18, 6, slice).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->ReadRange("first", -1, 6, slice).code(),
            absl::StatusCode::kOutOfRange);
  Tensor wrong_dtype = Tensor::Empty({6}, DType::kF32, Device::Cpu()).value();
  EXPECT_EQ((*reader)->ReadRange("first", 0, 6, wrong_dtype).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reader)->ReadRange("absent", 0, 6, slice).code(),
            absl::StatusCode::kNotFound);

  // ReadTensorInto insists on the exact shape: (5, 4) has the right element
  // count but is the transposed layout, a classic silent bug.
  Tensor into = Tensor::Empty({4, 5}, DType::kBF16, Device::Cpu()).value();
  ASSERT_TRUE((*reader)->ReadTensorInto("first", into).ok());
  EXPECT_EQ(Bytes(into), Bytes(first));
  Tensor transposed =
      Tensor::Empty({5, 4}, DType::kBF16, Device::Cpu()).value();
  absl::Status shape_error = (*reader)->ReadTensorInto("first", transposed);
  EXPECT_EQ(shape_error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(shape_error.message(), "[4, 5]"));

  // Reads touch only the tensor's own bytes: cut the file after "first"
  // (the reader is already open) and "first" still reads, "last" reports
  // the truncation.
  ASSERT_EQ(
      truncate(path.c_str(), static_cast<off_t>((*reader)->data_start() +
                                                (*reader)->Find("first")->end)),
      0);
  EXPECT_TRUE((*reader)->ReadTensorInto("first", into).ok());
  absl::StatusOr<Tensor> cut = (*reader)->ReadTensor("last");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(cut.status().message(), "\"last\""));
}

TEST(AtomicWriteTest, MissingDirectoryIsNotFoundNamingThePath) {
  const std::string path =
      MakeTestDirectory() + "/no_such_directory/model.safetensors";
  absl::Status status =
      WriteFile(path, {{"a", MakeTensor({2}, DType::kF32, 1.0f)}});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
}

TEST(AtomicWriteTest, ReadOnlyDirectoryIsPermissionDenied) {
  if (geteuid() == 0) {
    GTEST_SKIP() << "root ignores directory permissions";
  }
  const std::string directory = MakeTestDirectory();
  ASSERT_EQ(chmod(directory.c_str(), 0555), 0);
  const std::string path = directory + "/model.safetensors";
  absl::Status status =
      WriteFile(path, {{"a", MakeTensor({2}, DType::kF32, 1.0f)}});
  chmod(directory.c_str(), 0755);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
}

TEST(AtomicWriteTest, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string directory = MakeTestDirectory();
  const std::string path = directory + "/model.safetensors";
  Tensor old_values = MakeTensor({4}, DType::kF32, 1.0f);
  ASSERT_TRUE(WriteFile(path, {{"old", old_values}}).ok());
  const std::string old_bytes = ReadWholeFile(path);

  // A file size limit makes write() fail with EFBIG mid-file, the way a full
  // disk fails with ENOSPC, without needing a full disk.
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  // 4 MiB: larger than the writer's buffer, so Append itself hits the limit.
  Tensor big = MakeTensor({1 << 20}, DType::kF32, 1.0f);
  absl::StatusOr<std::unique_ptr<Writer>> writer =
      Writer::Create(path, {{"big", ElementType::kF32, big.shape()}});
  absl::Status append =
      writer.ok() ? (*writer)->Append("big", big) : writer.status();
  absl::Status finish = writer.ok() ? (*writer)->Finish() : writer.status();
  setrlimit(RLIMIT_FSIZE, &saved);

  EXPECT_EQ(append.code(), absl::StatusCode::kResourceExhausted) << append;
  EXPECT_TRUE(absl::StrContains(append.message(), path)) << append;
  EXPECT_EQ(finish, append) << "the failure must be sticky";
  EXPECT_EQ(ReadWholeFile(path), old_bytes);
  EXPECT_EQ(ListDirectory(directory),
            std::vector<std::string>{"model.safetensors"});
}

TEST(AtomicWriteTest, AnUnfinishedWriterLeavesNothing) {
  const std::string directory = MakeTestDirectory();
  {
    absl::StatusOr<std::unique_ptr<Writer>> writer = Writer::Create(
        directory + "/partial.safetensors", {{"a", ElementType::kF32, {8}}});
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(
        (*writer)->Append("a", MakeTensor({3}, DType::kF32, 1.0f)).ok());
    EXPECT_EQ(ListDirectory(directory).size(), 1u);  // the temporary
  }
  EXPECT_TRUE(ListDirectory(directory).empty());
}

}  // namespace
}  // namespace safetensors
}  // namespace ze
