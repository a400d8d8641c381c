// Collective agreement on success: the engine's way of turning one rank's
// local failure into an error on every rank instead of a hang. Public for
// programs that check their own arguments on every rank before Initialize
// (examples/train_gpt's --save_dir and --resume).
#ifndef ZE_ENGINE_AGREEMENT_H_
#define ZE_ENGINE_AGREEMENT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/stream.h"

namespace ze {
namespace engine {

// Every rank learns whether `local` failed on any rank (one one-element
// all-reduce), so an error on one rank (a directory rank 0 cannot create)
// does not leave the others waiting in a later collective. Returns `local`
// where it failed, and a FailedPrecondition saying so on the other ranks.
// A collective: every rank calls it at the same point.
absl::Status AgreeAcrossRanks(comm::Communicator& comm,
                              const absl::Status& local, const Stream& stream,
                              const std::string& what);

// Rank `root`'s `text` on every rank (a collective; at most 65536 bytes,
// InvalidArgument beyond). Lets ranks check they were given the same
// arguments (checkpoint directory and tag).
absl::StatusOr<std::string> BroadcastString(comm::Communicator& comm,
                                            const std::string& text, int root,
                                            const Stream& stream);

// Every rank's `values` on every rank, in rank order (a collective; every
// rank passes as many values). Floats because the collectives carry float
// types: a caller packs what it needs exactly into values below 2^24, or
// gathers figures for display. At one rank, `values` itself.
absl::StatusOr<std::vector<float>> AllGatherFloats(
    comm::Communicator& comm, const std::vector<float>& values,
    const Stream& stream);

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_AGREEMENT_H_
