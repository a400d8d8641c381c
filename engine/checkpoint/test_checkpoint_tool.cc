// test_checkpoint_tool: synthetic checkpoints for shell tests of the CLI.
//
//   test_checkpoint_tool write DIR --model=awkward|wide|gpt [--world_size=3]
//       [--tag=global_step1] [--steps=1]
//   test_checkpoint_tool shapes --model=M       JSON {name: shape} in order
//   test_checkpoint_tool expect FILE --model=M [--dtype=f32|bf16|f16]
//       [--kind=master]
//
// `expect` checks that FILE (a native consolidation of a checkpoint `write`
// made) holds every parameter with the right shape and exactly the values
// written, converted to --dtype. Exit 0 ok, 1 mismatch or error, 2 usage.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/safetensors/reader.h"
#include "core/status.h"
#include "engine/checkpoint/test_checkpoint.h"
#include "nlohmann/json.hpp"
#include "nn/pretrained/hf_gpt2.h"

namespace ze {
namespace checkpoint {
namespace testing {
namespace {

absl::StatusOr<NamesAndShapes> Model(const std::string& name) {
  if (name == "awkward") return AwkwardModel();
  if (name == "wide") {  // 12 x 2000 elements: the largest is 1/12
    NamesAndShapes model;
    for (int i = 0; i < 12; ++i) {
      model.push_back({absl::StrCat("layers.", i, ".weight"), {40, 50}});
    }
    return model;
  }
  if (name == "gpt") {
    nn::Gpt2Dims dims;
    dims.num_layers = 2;
    dims.channels = 8;
    dims.vocab_size = 11;
    dims.max_positions = 6;
    return nn::Gpt2ParameterShapes(dims);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--model=", name, ": use awkward, wide or gpt"));
}

absl::Status Expect(const std::string& path, const NamesAndShapes& model,
                    DType dtype, const std::string& kind) {
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<safetensors::Reader> file,
                      safetensors::Reader::Open(path));
  if (file->tensors().size() != model.size()) {
    return absl::DataLossError(
        absl::StrCat(path, " has ", file->tensors().size(),
                     " tensors, expected ", model.size()));
  }
  const DType stored = kind == kWeights ? DType::kBF16 : DType::kF32;
  for (size_t index = 0; index < model.size(); ++index) {
    const auto& [name, shape] = model[index];
    ZE_ASSIGN_OR_RETURN(Tensor got, file->ReadTensor(name));
    ZE_ASSIGN_OR_RETURN(
        Tensor expected,
        ExpectedParameter(kind, static_cast<int>(index), shape, stored, dtype));
    if (got.shape() != shape || got.dtype() != dtype ||
        std::memcmp(got.data(), expected.data(), got.nbytes()) != 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", name, " differs from what was saved"));
    }
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  std::string command, path;
  std::map<std::string, std::string> flags = {{"world_size", "3"},
                                              {"tag", "global_step1"},
                                              {"steps", "1"},
                                              {"dtype", "f32"},
                                              {"kind", kMaster}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t equals = arg.find('=');
    if (arg.rfind("--", 0) == 0 && equals != std::string::npos) {
      flags[arg.substr(2, equals - 2)] = arg.substr(equals + 1);
    } else if (command.empty()) {
      command = arg;
    } else {
      path = arg;
    }
  }
  absl::StatusOr<NamesAndShapes> model = Model(flags["model"]);
  absl::StatusOr<DType> dtype = ParseDType(flags["dtype"]);
  if (!model.ok() || !dtype.ok() || command.empty() ||
      (command != "shapes" && path.empty())) {
    std::fprintf(stderr, "usage: see test_checkpoint_tool.cc\n");
    return 2;
  }
  absl::Status status;
  if (command == "write") {
    TestCheckpointOptions options;
    options.tag = flags["tag"];
    if (!absl::SimpleAtoi(flags["world_size"], &options.world_size) ||
        !absl::SimpleAtoi(flags["steps"], &options.global_steps)) {
      return 2;
    }
    status = WriteTestCheckpoint(path, *model, options).status();
  } else if (command == "shapes") {
    nlohmann::ordered_json shapes = nlohmann::ordered_json::object();
    for (const auto& [name, shape] : *model) shapes[name] = shape;
    std::printf("%s\n", shapes.dump().c_str());
  } else if (command == "expect") {
    status = Expect(path, *model, *dtype, flags["kind"]);
  } else {
    std::fprintf(stderr, "unknown command %s\n", command.c_str());
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "test_checkpoint_tool %s: %s\n", command.c_str(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace testing
}  // namespace checkpoint
}  // namespace ze

int main(int argc, char** argv) {
  return ze::checkpoint::testing::Main(argc, argv);
}
