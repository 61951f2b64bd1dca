// TorchDistributedSampler through torch::data::make_data_loader: each rank's
// loader yields exactly DistributedSampler's indices (which
// distributed_sampler_test checks against PyTorch), set_epoch reshuffles,
// save/load resumes mid-epoch, and bad options or archives are refused.
#include "worker/data/torch_sampler.h"

#include <torch/torch.h>

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/distributed_sampler.h"

namespace gradsync {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::torch::data::datasets::TensorDataset;

SamplerOptions Options(int64_t n, int rank, int world_size, bool shuffle,
                       bool drop_last, uint64_t seed = 7) {
  SamplerOptions options;
  options.dataset_size = n;
  options.rank = rank;
  options.world_size = world_size;
  options.shuffle = shuffle;
  options.seed = seed;
  options.drop_last = drop_last;
  return options;
}

TorchDistributedSampler MustCreate(const SamplerOptions& options) {
  absl::StatusOr<TorchDistributedSampler> sampler =
      TorchDistributedSampler::Create(options);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *sampler;
}

// DistributedSampler's indices for `options` in `epoch`: the reference.
std::vector<int64_t> Reference(const SamplerOptions& options, int64_t epoch) {
  absl::StatusOr<DistributedSampler> sampler =
      DistributedSampler::Create(options);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  sampler->SetEpoch(epoch);
  return sampler->Indices();
}

// A data loader over samples 0..n-1 (sample i is the scalar i) drawing from
// `sampler` (a copy sharing its state) in batches of `batch_size`.
auto MakeLoader(const TorchDistributedSampler& sampler, int64_t n,
                size_t batch_size, size_t workers = 0) {
  return torch::data::make_data_loader(
      TensorDataset(torch::arange(n)), sampler,
      torch::data::DataLoaderOptions(batch_size).workers(workers));
}

// The samples of one pass over `loader` (one epoch), in order.
template <typename Loader>
std::vector<int64_t> Epoch(Loader& loader) {
  std::vector<int64_t> samples;
  for (const auto& batch : loader) {
    for (const auto& example : batch) {
      samples.push_back(example.data.template item<int64_t>());
    }
  }
  return samples;
}

// The first `batches` batches of one pass over `loader`.
template <typename Loader>
std::vector<int64_t> FirstBatches(Loader& loader, int batches) {
  std::vector<int64_t> samples;
  auto it = loader.begin();
  for (int b = 0; b < batches; ++b) {
    if (b > 0) ++it;  // not past the last wanted: ++ fetches the next batch
    if (it == loader.end()) break;
    for (const auto& example : *it) {
      samples.push_back(example.data.template item<int64_t>());
    }
  }
  return samples;
}

struct Division {
  int world_size;
  bool shuffle;
  bool drop_last;
};

void PrintTo(const Division& d, std::ostream* os) {
  *os << "world " << d.world_size << (d.shuffle ? ", shuffled" : ", in order")
      << (d.drop_last ? ", drop_last" : ", padded");
}

class LoaderMatchesDistributedSampler
    : public ::testing::TestWithParam<Division> {};

// 10 samples in batches of 3, epoch 3, every rank.
TEST_P(LoaderMatchesDistributedSampler, OnEveryRank) {
  const Division d = GetParam();
  for (int rank = 0; rank < d.world_size; ++rank) {
    SCOPED_TRACE(testing::Message() << "rank " << rank);
    const SamplerOptions options =
        Options(10, rank, d.world_size, d.shuffle, d.drop_last);
    TorchDistributedSampler sampler = MustCreate(options);
    auto loader = MakeLoader(sampler, 10, 3);
    sampler.set_epoch(3);
    EXPECT_EQ(Epoch(*loader), Reference(options, 3));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Divisions, LoaderMatchesDistributedSampler,
    ::testing::Values(Division{1, false, false}, Division{3, false, false},
                      Division{3, false, true}, Division{3, true, false},
                      Division{3, true, true}, Division{4, true, false},
                      Division{4, true, true}),
    [](const ::testing::TestParamInfo<Division>& info) {
      return "World" + std::to_string(info.param.world_size) +
             (info.param.shuffle ? "Shuffled" : "InOrder") +
             (info.param.drop_last ? "DropLast" : "Padded");
    });

// Rank 1 of 3 over 10 samples, seed 7: PyTorch's lists for epochs 0 and 1
// (from distributed_sampler_test), through one loader.
TEST(TorchDistributedSamplerTest, SetEpochChangesTheShuffle) {
  TorchDistributedSampler sampler = MustCreate(Options(10, 1, 3, true, false));
  auto loader = MakeLoader(sampler, 10, 3);
  sampler.set_epoch(0);
  EXPECT_THAT(Epoch(*loader), ElementsAre(0, 1, 6, 5));
  sampler.set_epoch(1);
  EXPECT_THAT(Epoch(*loader), ElementsAre(5, 2, 7, 3));
}

// As in PyTorch: without set_epoch every epoch repeats epoch 0's order.
TEST(TorchDistributedSamplerTest, WithoutSetEpochEveryPassRepeatsTheOrder) {
  TorchDistributedSampler sampler = MustCreate(Options(10, 1, 3, true, false));
  auto loader = MakeLoader(sampler, 10, 3);
  EXPECT_THAT(Epoch(*loader), ElementsAre(0, 1, 6, 5));
  EXPECT_THAT(Epoch(*loader), ElementsAre(0, 1, 6, 5));
}

// set_epoch inside an epoch leaves the running one alone; reset deals it.
TEST(TorchDistributedSamplerTest, SetEpochTakesEffectAtTheNextReset) {
  TorchDistributedSampler sampler = MustCreate(Options(10, 1, 3, true, false));
  ASSERT_EQ(sampler.next(2), (std::vector<size_t>{0, 1}));
  sampler.set_epoch(1);
  EXPECT_EQ(sampler.next(5), (std::vector<size_t>{6, 5}));
  sampler.reset();
  EXPECT_EQ(sampler.next(5), (std::vector<size_t>{5, 2, 7, 3}));
}

TEST(TorchDistributedSamplerTest, NextHandsOutBatchesThenNullopt) {
  TorchDistributedSampler sampler = MustCreate(Options(10, 2, 3, false, false));
  EXPECT_EQ(sampler.next(3), (std::vector<size_t>{2, 5, 8}));
  EXPECT_EQ(sampler.next(3), (std::vector<size_t>{1}));  // padded from 0..
  EXPECT_EQ(sampler.next(3), torch::nullopt);
  EXPECT_EQ(sampler.index(), 4u);
  EXPECT_EQ(sampler.num_samples(), 4u);
}

TEST(TorchDistributedSamplerTest, NextOfZeroIndicesThrows) {
  TorchDistributedSampler sampler = MustCreate(Options(10, 0, 1, false, false));
  EXPECT_THROW(sampler.next(0), c10::Error);
}

// The data loader keeps its own copy; the caller's handle sees its progress.
TEST(TorchDistributedSamplerTest, CopiesShareOneState) {
  TorchDistributedSampler sampler = MustCreate(Options(10, 0, 2, false, false));
  auto loader = MakeLoader(sampler, 10, 2);
  EXPECT_THAT(FirstBatches(*loader, 1), ElementsAre(0, 2));
  EXPECT_EQ(sampler.index(), 2u);
}

// Workers fetch batches on their own threads; the loader still yields them
// in the sampler's order.
TEST(TorchDistributedSamplerTest, LoaderWithWorkersYieldsTheSameIndices) {
  const SamplerOptions options = Options(50, 1, 3, true, false);
  TorchDistributedSampler sampler = MustCreate(options);
  auto loader = MakeLoader(sampler, 50, 4, /*workers=*/2);
  sampler.set_epoch(2);
  EXPECT_EQ(Epoch(*loader), Reference(options, 2));
}

std::string Save(const TorchDistributedSampler& sampler) {
  std::stringstream stream;
  torch::save(sampler, stream);
  return stream.str();
}

void Load(TorchDistributedSampler& sampler, const std::string& bytes) {
  std::stringstream stream(bytes);
  torch::load(sampler, stream);
}

// Rank 1 of 2 over 20 shuffled samples (10 per rank), epoch 2, batches of
// 3: two batches (6 samples) in, the state is saved; a new sampler loading
// it yields the other 4 of the same epoch.
TEST(TorchDistributedSamplerTest, SaveAndLoadResumeMidEpoch) {
  const SamplerOptions options = Options(20, 1, 2, true, false);
  const std::vector<int64_t> epoch2 = Reference(options, 2);
  std::string saved;
  {
    TorchDistributedSampler sampler = MustCreate(options);
    auto loader = MakeLoader(sampler, 20, 3);
    sampler.set_epoch(2);
    ASSERT_EQ(FirstBatches(*loader, 2),
              std::vector<int64_t>(epoch2.begin(), epoch2.begin() + 6));
    saved = Save(sampler);
  }
  TorchDistributedSampler resumed = MustCreate(options);
  Load(resumed, saved);
  EXPECT_EQ(resumed.epoch(), 2);
  auto loader = MakeLoader(resumed, 20, 3);
  resumed.set_epoch(2);  // the training loop's call for the resumed epoch
  EXPECT_EQ(Epoch(*loader),
            std::vector<int64_t>(epoch2.begin() + 6, epoch2.end()));
}

// The archive of a sampler that dealt 6 indices of epoch 2.
std::string PositionSixIntoEpochTwo(const SamplerOptions& options) {
  TorchDistributedSampler sampler = MustCreate(options);
  sampler.set_epoch(2);
  sampler.reset();
  EXPECT_TRUE(sampler.next(6).has_value());
  return Save(sampler);
}

// The loaded position holds for one pass: the next epoch starts over.
TEST(TorchDistributedSamplerTest, AfterTheResumedEpochTheNextIsWhole) {
  const SamplerOptions options = Options(20, 1, 2, true, false);
  TorchDistributedSampler resumed = MustCreate(options);
  Load(resumed, PositionSixIntoEpochTwo(options));
  auto loader = MakeLoader(resumed, 20, 3);
  ASSERT_EQ(Epoch(*loader).size(), 4u);
  resumed.set_epoch(3);
  EXPECT_EQ(Epoch(*loader), Reference(options, 3));
}

// A position saved in epoch 2 means nothing in epoch 5: set_epoch to
// another epoch before the next reset deals that epoch whole.
TEST(TorchDistributedSamplerTest,
     SetEpochToAnotherEpochDropsTheLoadedPosition) {
  const SamplerOptions options = Options(20, 1, 2, true, false);
  TorchDistributedSampler resumed = MustCreate(options);
  Load(resumed, PositionSixIntoEpochTwo(options));
  auto loader = MakeLoader(resumed, 20, 3);
  resumed.set_epoch(5);
  EXPECT_EQ(Epoch(*loader), Reference(options, 5));
}

TEST(TorchDistributedSamplerTest, LoadRefusesAnotherRanksState) {
  TorchDistributedSampler rank0 = MustCreate(Options(20, 0, 2, true, false));
  ASSERT_TRUE(rank0.next(3).has_value());
  TorchDistributedSampler rank1 = MustCreate(Options(20, 1, 2, true, false));
  try {
    Load(rank1, Save(rank0));
    FAIL() << "loading rank 0's state into rank 1 must throw";
  } catch (const c10::Error& e) {
    EXPECT_THAT(
        e.what_without_backtrace(),
        AllOf(HasSubstr("saved by rank 0 of 2 over 20 samples"),
              HasSubstr("this sampler is rank 1 of 2 over 20 samples")));
  }
  EXPECT_EQ(rank1.index(), 0u) << "a refused load leaves the sampler alone";
}

TEST(TorchDistributedSamplerTest, LoadRefusesAnArchiveWithoutItsKeys) {
  torch::serialize::OutputArchive empty;
  std::stringstream stream;
  empty.save_to(stream);
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  TorchDistributedSampler sampler = MustCreate(Options(20, 0, 2, true, false));
  try {
    sampler.load(archive);
    FAIL() << "an archive without the sampler's keys must be refused";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("has no 'epoch'"));
  }
}

// LibTorch's reset(new_size): the dataset now has 6 samples; rank 0 of 2
// takes 0, 2, 4.
TEST(TorchDistributedSamplerTest, ResetWithANewSizeDividesTheNewSize) {
  TorchDistributedSampler sampler = MustCreate(Options(10, 0, 2, false, false));
  sampler.reset(6);
  EXPECT_EQ(sampler.num_samples(), 3u);
  EXPECT_EQ(sampler.next(10), (std::vector<size_t>{0, 2, 4}));
}

TEST(TorchDistributedSamplerTest, ResetToASizeBelowStartThrows) {
  SamplerOptions options = Options(10, 0, 2, false, false);
  options.start = 8;
  TorchDistributedSampler sampler = MustCreate(options);
  try {
    sampler.reset(6);
    FAIL() << "a dataset of 6 cannot be divided from position 8";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(),
                AllOf(HasSubstr("reset(6)"), HasSubstr("start 8")));
  }
}

struct Invalid {
  std::string name;
  SamplerOptions options;
  std::string message;
};

void PrintTo(const Invalid& invalid, std::ostream* os) { *os << invalid.name; }

class InvalidOptions : public ::testing::TestWithParam<Invalid> {};

TEST_P(InvalidOptions, AreInvalidArgument) {
  absl::StatusOr<TorchDistributedSampler> sampler =
      TorchDistributedSampler::Create(GetParam().options);
  EXPECT_EQ(sampler.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sampler.status().message(), HasSubstr(GetParam().message));
}

Invalid MakeInvalid(std::string name, SamplerOptions options,
                    std::string message) {
  return Invalid{std::move(name), options, std::move(message)};
}

SamplerOptions WithStart(SamplerOptions options, int64_t start) {
  options.start = start;
  return options;
}

INSTANTIATE_TEST_SUITE_P(
    Refused, InvalidOptions,
    ::testing::Values(
        MakeInvalid("NegativeSize", Options(-1, 0, 1, false, false),
                    "dataset size -1 is negative"),
        MakeInvalid("NoRanks", Options(10, 0, 0, false, false),
                    "world size 0 is below 1"),
        MakeInvalid("RankOutsideTheWorld", Options(10, 2, 2, false, false),
                    "rank 2 is outside [0, 2)"),
        MakeInvalid("StartBeyondTheData",
                    WithStart(Options(10, 0, 2, false, false), 11),
                    "start 11 is outside [0, 10]")),
    [](const ::testing::TestParamInfo<Invalid>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace gradsync
