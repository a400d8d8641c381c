#include "engine/agreement.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace engine {

absl::Status AgreeAcrossRanks(comm::Communicator& comm,
                              const absl::Status& local, const Stream& stream,
                              const std::string& what) {
  if (comm.world_size() == 1) return local;
  ZE_ASSIGN_OR_RETURN(Tensor flag,
                      Tensor::Zeros({1}, DType::kF32, comm.device(), stream));
  ZE_RETURN_IF_ERROR(Fill(flag, local.ok() ? 0.0f : 1.0f, stream));
  ZE_ASSIGN_OR_RETURN(comm::Work work,
                      comm.AllReduce(flag, flag, comm::ReduceOp::kMax, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(std::vector<float> any_failed,
                      ToHostFloats(flag, stream));
  if (!local.ok()) return local;
  if (any_failed[0] > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " failed on another rank (its error is in its log); rank ",
        comm.rank(), " stops too"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> AllGatherFloats(
    comm::Communicator& comm, const std::vector<float>& values,
    const Stream& stream) {
  if (comm.world_size() == 1) return values;
  const int64_t count = static_cast<int64_t>(values.size());
  ZE_ASSIGN_OR_RETURN(
      const Tensor in,
      FromHostFloats(values, {count}, DType::kF32, comm.device(), stream));
  ZE_ASSIGN_OR_RETURN(const Tensor out,
                      Tensor::Empty({int64_t{comm.world_size()} * count},
                                    DType::kF32, comm.device()));
  ZE_ASSIGN_OR_RETURN(comm::Work work, comm.AllGather(in, out, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  return ToHostFloats(out, stream);
}

namespace {

// Small integers (below 2^24, exact in f32) to every rank from `root`. The
// communicator's collectives carry float types only.
absl::StatusOr<std::vector<int32_t>> Broadcast(comm::Communicator& comm,
                                               std::vector<int32_t> values,
                                               int root, const Stream& stream) {
  std::vector<float> floats(values.begin(), values.end());
  ZE_ASSIGN_OR_RETURN(
      Tensor on_device,
      FromHostFloats(floats, {static_cast<int64_t>(floats.size())}, DType::kF32,
                     comm.device(), stream));
  ZE_ASSIGN_OR_RETURN(comm::Work work, comm.Broadcast(on_device, root, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(floats, ToHostFloats(on_device, stream));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<int32_t>(floats[i]);
  }
  return values;
}

}  // namespace

absl::StatusOr<std::string> BroadcastString(comm::Communicator& comm,
                                            const std::string& text, int root,
                                            const Stream& stream) {
  constexpr size_t kMaxBytes = 65536;
  if (comm.world_size() == 1) return text;
  // A rank with an over-long text still takes part (with an empty one), so
  // the others are not left waiting; it reports the error after.
  const bool too_long = text.size() > kMaxBytes;
  ZE_ASSIGN_OR_RETURN(
      std::vector<int32_t> length,
      Broadcast(comm, {too_long ? 0 : static_cast<int32_t>(text.size())}, root,
                stream));
  std::vector<int32_t> bytes(std::max<int32_t>(length[0], 1), 0);
  if (comm.rank() == root && !too_long) {
    for (size_t i = 0; i < text.size(); ++i) {
      bytes[i] = static_cast<unsigned char>(text[i]);
    }
  }
  ZE_ASSIGN_OR_RETURN(bytes, Broadcast(comm, std::move(bytes), root, stream));
  if (too_long) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BroadcastString: ", text.size(), " bytes, more than ", kMaxBytes));
  }
  std::string result(length[0], '\0');
  for (int32_t i = 0; i < length[0]; ++i) {
    result[i] = static_cast<char>(bytes[i]);
  }
  return result;
}

}  // namespace engine
}  // namespace ze
