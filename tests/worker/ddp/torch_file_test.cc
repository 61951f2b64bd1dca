// Files torch.save and torch.load exchange: what PyTorch writes (OrderedDict
// state dicts, optimizer state dicts with int keys, views sharing a
// storage, every scalar kind) reads here, what we write Python reads, and a
// bad file is a clear error. Python is Debian's python3-torch.
#include "worker/ddp/torch_file.h"

#include <caffe2/serialize/inline_container.h>
#include <dirent.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::kPythonLoad;
using testing::RunPython;
using testing::TempPath;

c10::IValue At(const c10::IValue& dict, const c10::IValue& key) {
  return dict.toGenericDict().at(key);
}

TEST(TorchFileTest, ReadsWhatTorchSaveWrites) {
  const std::string path = TempPath("from_python.pt");
  ASSERT_TRUE(RunPython("script", absl::StrCat(
                "import collections, torch\n"
                "base = torch.arange(12, dtype=torch.float32)\n"
                "sd = collections.OrderedDict([('b.weight', base.view(3, 4)),"
                " ('a.bias', base[4:8]), ('n', torch.tensor(7))])\n"
                "sd._metadata = collections.OrderedDict(x=dict(version=1))\n"
                "opt = {'state': {0: {'momentum_buffer': torch.ones(2)}, 1: "
                "{'momentum_buffer': None}}, 'param_groups': [{'lr': 0.5, "
                "'nesterov': False, 'params': [0, 1]}]}\n"
                "torch.save({'model': sd, 'optimizer': opt, 'step': 3, 'big': "
                "2**40, 'neg': -5, 'name': 'run', 'pair': (1, 2.5), "
                "'half': torch.ones(2, dtype=torch.float16)}, '",
                path, "')\n")));
  absl::StatusOr<c10::IValue> value = ReadTorchFile(path);
  ASSERT_TRUE(value.ok()) << value.status();
  c10::IValue model = At(*value, std::string("model"));
  ASSERT_TRUE(model.isGenericDict());
  // In the file's order.
  std::vector<std::string> keys;
  for (const auto& entry : model.toGenericDict()) {
    keys.push_back(entry.key().toStringRef());
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"b.weight", "a.bias", "n"}));
  torch::Tensor weight = At(model, std::string("b.weight")).toTensor();
  EXPECT_TRUE(torch::equal(weight, torch::arange(12, torch::kFloat32).view({3, 4})));
  torch::Tensor bias = At(model, std::string("a.bias")).toTensor();
  EXPECT_TRUE(torch::equal(bias, torch::arange(4, 8, torch::kFloat32)));
  EXPECT_EQ(bias.data_ptr<float>(), weight.data_ptr<float>() + 4);  // one storage
  EXPECT_EQ(At(model, std::string("n")).toTensor().item<int64_t>(), 7);

  c10::IValue optimizer = At(*value, std::string("optimizer"));
  c10::IValue state = At(optimizer, std::string("state"));
  EXPECT_TRUE(torch::equal(
      At(At(state, int64_t{0}), std::string("momentum_buffer")).toTensor(),
      torch::ones({2})));
  EXPECT_TRUE(At(At(state, int64_t{1}), std::string("momentum_buffer")).isNone());
  c10::IValue group = At(optimizer, std::string("param_groups")).toListRef()[0];
  EXPECT_DOUBLE_EQ(At(group, std::string("lr")).toDouble(), 0.5);
  EXPECT_FALSE(At(group, std::string("nesterov")).toBool());
  EXPECT_EQ(At(*value, std::string("step")).toInt(), 3);
  EXPECT_EQ(At(*value, std::string("big")).toInt(), int64_t{1} << 40);
  EXPECT_EQ(At(*value, std::string("neg")).toInt(), -5);
  EXPECT_EQ(At(*value, std::string("name")).toStringRef(), "run");
  EXPECT_DOUBLE_EQ(At(*value, std::string("pair")).toTupleRef().elements()[1].toDouble(), 2.5);
  EXPECT_EQ(At(*value, std::string("half")).toTensor().scalar_type(), torch::kHalf);
}

TEST(TorchFileTest, PythonReadsWhatWeWriteAndNothingIsLeftBehind) {
  const std::string dir = TempPath("written");
  ASSERT_EQ(std::system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir).c_str()), 0);
  const std::string path = dir + "/ours.pt";
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  state.insert(int64_t{0}, torch::full({2}, 3.0));
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("state", state);
  top.insert("step", int64_t{9});
  top.insert("lr", 0.25);
  ASSERT_TRUE(WriteTorchFile(c10::IValue(top), path).ok());
  ASSERT_TRUE(WriteTorchFile(c10::IValue(top), path).ok());  // replaces it
  ASSERT_TRUE(RunPython("script", absl::StrCat(
                kPythonLoad,
                "d = load('", path, "')\n"
                "assert d['step'] == 9 and d['lr'] == 0.25, d\n"
                "assert torch.equal(d['state'][0], torch.full((2,), 3.0)), d\n")));
  // Only the file: the temporary was renamed over it.
  int entries = 0;
  DIR* listing = opendir(dir.c_str());
  ASSERT_NE(listing, nullptr);
  while (dirent* e = readdir(listing)) {
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++entries;
  }
  closedir(listing);
  EXPECT_EQ(entries, 1);
  // And it reads back.
  absl::StatusOr<c10::IValue> back = ReadTorchFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(At(*back, std::string("step")).toInt(), 9);
}

// torch.load(weights_only=True), PyTorch's default from 2.6, refuses
// torch::pickle_save's type tags and typed lists (globals of
// torch.jit._pickle): the pickle we write has none, typed containers
// included, and reads back the same. (Python's weights_only load itself runs
// above where torch is 2.x: deploy/torch_runtime_check.sh.)
TEST(TorchFileTest, WhatWeWriteHasNoTypeTags) {
  const std::string path = TempPath("untagged.pt");
  c10::Dict<std::string, int64_t> counters;
  counters.insert("samples", 7);
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("params", c10::List<int64_t>({0, 1, 2}));
  top.insert("betas", c10::List<double>({0.9, 0.999}));
  top.insert("flags", c10::List<bool>({true, false}));
  top.insert("tensors", c10::List<at::Tensor>({torch::ones({2})}));
  top.insert("counters", counters);
  top.insert("pair", c10::ivalue::Tuple::create(
                         {c10::IValue(c10::List<int64_t>({5})), int64_t{6}}));
  ASSERT_TRUE(WriteTorchFile(c10::IValue(top), path).ok());

  caffe2::serialize::PyTorchStreamReader archive(path);
  auto [data, size] = archive.getRecord("data.pkl");
  const std::string pickle(static_cast<const char*>(data.get()), size);
  EXPECT_THAT(pickle, Not(HasSubstr("torch.jit._pickle")));
  EXPECT_THAT(pickle, HasSubstr("_rebuild_tensor_v2"));  // a tensor is there

  absl::StatusOr<c10::IValue> read = ReadTorchFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  auto ints = [](const c10::IValue& list) {
    std::vector<int64_t> out;
    for (const c10::IValue& item : list.toListRef()) out.push_back(item.toInt());
    return out;
  };
  EXPECT_EQ(ints(At(*read, "params")), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(At(*read, "betas").toListRef()[1].toDouble(), 0.999);
  EXPECT_FALSE(At(*read, "flags").toListRef()[1].toBool());
  EXPECT_TRUE(torch::equal(At(*read, "tensors").toListRef()[0].toTensor(),
                           torch::ones({2})));
  EXPECT_EQ(At(At(*read, "counters"), "samples").toInt(), 7);
  EXPECT_EQ(ints(At(*read, "pair").toTupleRef().elements()[0]),
            (std::vector<int64_t>{5}));
}

TEST(TorchFileTest, BadFilesAreClearErrors) {
  EXPECT_EQ(ReadTorchFile(TempPath("no_such.pt")).status().code(),
            absl::StatusCode::kNotFound);
  const std::string garbage = TempPath("garbage.pt");
  std::ofstream(garbage) << "not a zip";
  absl::Status status = ReadTorchFile(garbage).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("not a file torch.save wrote"));

  // An object outside what is read: a Python class instance.
  const std::string object = TempPath("object.pt");
  ASSERT_TRUE(RunPython("script", absl::StrCat("import torch, fractions\n"
                                   "torch.save({'x': fractions.Fraction(1, 3)}, '",
                                   object, "')\n")));
  status = ReadTorchFile(object).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("fractions.Fraction"));
  EXPECT_EQ(WriteTorchFile(c10::IValue(int64_t{1}), "/no/such/dir/x.pt").code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace gradsync
