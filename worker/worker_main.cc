// gradsync-worker: the reference trainer. Joins a job through the
// coordinator (RunJob), builds the negotiated process group (Gloo on CPU,
// NCCL on CUDA), trains a model of worker/trainer/models.h with
// DistributedDataParallel, recovers in place when a peer is lost, and exits
// 0 on success.
//
//   gradsync-worker --coordinator=HOST:PORT --job=NAME --nnodes=MIN[:MAX]
//       [--model=mlp|cnn|cnn_bn|resnet18|resnet50]
//       [--dataset=synthetic|mnist|cifar10 --data_dir=DIR] ...
#include <malloc.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/failpoint.h"
#include "common/job_config.h"
#include "common/mutex_checks.h"
#include "common/status_macros.h"
#include "worker/backend/nccl_faults.h"
#include "worker/runtime/run_job.h"
#include "worker/trainer/trainer.h"

// Joining.
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the coordinator's TLS certificate (empty: "
          "plaintext)");
ABSL_FLAG(std::string, tls_cert, "",
          "with --tls_ca: this client's PEM certificate, for a coordinator "
          "that requires one (--tls_client_ca)");
ABSL_FLAG(std::string, tls_key, "", "the PEM private key of --tls_cert");
ABSL_FLAG(std::string, token_file, "",
          "a file holding this job's token, for a coordinator with "
          "--auth=token (default: $GRADSYNC_TOKEN)");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:29400",
          "the coordinator, HOST:PORT; or its replicas (--etcd), "
          "HOST:PORT,HOST:PORT,... (names in a list are resolved to their "
          "IPv4 addresses once, at start)");
ABSL_FLAG(std::string, job, "", "job id (created by the first join)");
ABSL_FLAG(std::string, nnodes, "1", "nodes per round: N or MIN:MAX");
ABSL_FLAG(int, nproc_per_node, 1, "worker processes per node");
ABSL_FLAG(std::string, node_id, "",
          "groups this process with others on the same node (default: "
          "hostname)");
ABSL_FLAG(std::string, address, "",
          "address the other workers reach this one at (default: 127.0.0.1 "
          "when the coordinator is on loopback, else the hostname)");
ABSL_FLAG(std::string, network_interface, "",
          "Gloo: bind this interface (e.g. eth0) instead of --address");
ABSL_FLAG(bool, shared_memory, true,
          "when every rank of a Gloo round is on this node, run collectives "
          "through shared memory instead of TCP loopback");
ABSL_FLAG(absl::Duration, join_timeout, absl::Minutes(10),
          "how long to wait for the round to close");
ABSL_FLAG(absl::Duration, last_call_timeout, absl::Seconds(30),
          "once MIN nodes joined, how long the round waits for more");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(5),
          "bootstrap and per-collective timeout: a peer that stops "
          "answering fails the step after this long instead of hanging it");
ABSL_FLAG(double, collective_timeout_factor, 10,
          "a collective in flight longer than this x the 99th percentile of "
          "the round's step times (at least --min_collective_timeout, at "
          "most --timeout; after 8 steps) aborts the round, which re-forms; "
          "0: only --timeout");
ABSL_FLAG(absl::Duration, min_collective_timeout, absl::Seconds(10),
          "the shortest self-set collective timeout (the coordinator's hang "
          "diagnosis, which only reports, goes down to 1 s)");
ABSL_FLAG(int, max_recoveries, 3,
          "how often this process may re-form its round after losing a peer "
          "before it gives up");
ABSL_FLAG(std::string, failpoint, "",
          "for tests: NAME[:N],... fires failpoint NAME on its N-th pass "
          "(default 1). step (after a step committed) and state_transfer (in "
          "the middle of copying a round's training state) exit with code 86; "
          "nccl_async_error (the N-th NCCL collective of this process fails "
          "asynchronously after it was enqueued) and nccl_hang (it never "
          "completes) need the NCCL backend (--device=cuda or sim); "
          "corrupt_parameters:STEP flips one bit of one parameter right after "
          "training step STEP (a step number, not a pass count); hang:STEP "
          "stands still before step STEP's first collective, heartbeating, "
          "until the coordinator ends the round");
ABSL_FLAG(std::string, failure_policy, "",
          "what losing a member does to the job (set by its first join): "
          "recover (re-form the round in place; the default) or fail");
ABSL_FLAG(std::string, divergence_policy, "",
          "what a replica whose parameter fingerprints differ from the "
          "others' does to the job (set by its first join): heal (re-form "
          "the round from a rank of the majority; the default) or fail");
ABSL_FLAG(std::string, straggler_policy, "",
          "what a rank flagged as a straggler does to the job (set by its "
          "first join): rebalance (with --global_batch_size, move "
          "micro-batches away from it in proportion to measured speed, and "
          "back when it recovers; the default) or report (only name it)");
ABSL_FLAG(absl::Duration, straggler_threshold, absl::ZeroDuration(),
          "how late a rank's first gradient bucket must be, consistently, to "
          "flag it a straggler (set by the job's first join); 0: the "
          "coordinator's --straggler_threshold (100ms)");
ABSL_FLAG(double, slowdown, 1.0,
          "for tests and benchmarks: make this process's training compute F "
          "times slower (it sleeps F-1 times each micro-batch's compute "
          "after its forward)");
ABSL_FLAG(int64_t, slowdown_until_round, 0,
          "with --slowdown: slow only in rounds up to this one (0: every "
          "round), a straggler that recovers");
ABSL_FLAG(absl::Duration, step_sleep, absl::ZeroDuration(),
          "for tests: every training step first sleeps this long (a slow "
          "step that costs no CPU)");
ABSL_FLAG(int64_t, fingerprint_every, 100,
          "fingerprint the parameters and optimizer state every N steps "
          "(and after the last) for the coordinator to compare across "
          "ranks; 0: never");
ABSL_FLAG(bool, standalone, false,
          "train in this process alone: no coordinator, no gradient sync "
          "(the single-process baseline)");
// Devices and backends.
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda, or sim (a simulated GPU per local rank: host memory "
          "through every GPU code path and NCCL over shared memory, for "
          "tests; GRADSYNC_SIM_DEVICES devices per node, default 8)");
ABSL_FLAG(std::string, backend, "auto",
          "auto (NCCL when every member has CUDA, else Gloo), gloo or nccl");
// Model and data.
ABSL_FLAG(std::string, model, "mlp",
          "mlp, cnn (28x28 images), cnn_bn (cnn with batch norm), resnet18 or "
          "resnet50 (torchvision's, 32x32 RGB images)");
ABSL_FLAG(bool, sync_batchnorm, false,
          "convert the model's BatchNorm layers to SyncBatchNorm (statistics "
          "of the global batch)");
ABSL_FLAG(int, hidden, 128, "hidden width (mlp: fc1, fc2; cnn: fc1)");
ABSL_FLAG(std::string, dataset, "synthetic",
          "synthetic (images of the shape --model takes), mnist or cifar10 "
          "(the binary version, from --data_dir)");
ABSL_FLAG(std::string, data_dir, "",
          "mnist: folder with train-images-idx3-ubyte and "
          "train-labels-idx1-ubyte");
ABSL_FLAG(int64_t, synthetic_size, 60000, "images in the synthetic dataset");
// Optimization.
ABSL_FLAG(int, batch_size, 32, "samples per rank per micro-batch");
ABSL_FLAG(int64_t, global_batch_size, 0,
          "an exact global batch: every step trains on the next N samples of "
          "the epoch's order, cut into micro-batches of --batch_size shared "
          "among the ranks, the same on any world size (0: off)");
ABSL_FLAG(int64_t, steps, 0, "optimizer steps (0: run --epochs)");
ABSL_FLAG(int, epochs, 1, "passes over the dataset when --steps is 0");
ABSL_FLAG(double, lr, 0.01, "SGD learning rate");
ABSL_FLAG(double, momentum, 0.0, "SGD momentum");
ABSL_FLAG(bool, shuffle, false,
          "reshuffle every epoch (randperm seeded by seed + epoch)");
ABSL_FLAG(bool, drop_last, false,
          "drop the samples that do not divide evenly among ranks");
ABSL_FLAG(uint64_t, seed, 0, "seeds initialization, data and shuffling");
ABSL_FLAG(int, accumulate, 1,
          "micro-batches per optimizer step (gradients accumulate under "
          "no_sync between syncs)");
// DDP.
ABSL_FLAG(double, bucket_cap_mb, 25.0, "bucket size cap, MiB");
ABSL_FLAG(double, first_bucket_mb, 1.0, "size cap of the first bucket, MiB");
ABSL_FLAG(bool, gradient_as_bucket_view, true,
          "gradients live in the buckets: no copy into them before the "
          "all-reduce nor out of them after (PyTorch's default is false)");
ABSL_FLAG(bool, find_unused_parameters, false,
          "reduce parameters that got no gradient as zeros instead of "
          "failing the step");
ABSL_FLAG(bool, broadcast_buffers, true,
          "copy rank 0's buffers to every rank before each forward");
ABSL_FLAG(std::string, comm_hook, "allreduce",
          "how gradient buckets are reduced: allreduce, fp16_compress, "
          "bf16_compress or powersgd");
ABSL_FLAG(int, powersgd_rank, 1,
          "PowerSGD's matrix approximation rank (--comm_hook=powersgd)");
ABSL_FLAG(int64_t, powersgd_start_iter, 1000,
          "steps of plain all-reduce before PowerSGD compresses (at least 2)");
ABSL_FLAG(std::vector<std::string>, rank_batches, {},
          "uneven inputs: per rank, at most this many batches per epoch "
          "(e.g. 10,7,3 for a 3-rank round); ranks out of data keep the "
          "others going");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "rank 0 writes checkpoints here (torch.load reads them)");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "write a checkpoint every N steps (and after the last); 0: only "
          "after the last");
ABSL_FLAG(int, checkpoint_keep, 3, "checkpoints to keep");
ABSL_FLAG(bool, resume, false,
          "start from the newest checkpoint in --checkpoint_dir (from scratch "
          "when there is none)");
ABSL_FLAG(int, threads, 0,
          "LibTorch intra-op threads (0: LibTorch's default, one per core)");
// Output.
ABSL_FLAG(int, log_every, 10, "print progress every N steps (0: never)");
ABSL_FLAG(int, warmup_steps, 2, "steps left out of the summary's timings");
ABSL_FLAG(std::string, load_params, "",
          "start from these parameters (a torch.save'd dict name -> tensor)");
ABSL_FLAG(std::string, save_params, "",
          "rank 0 writes the trained parameters here (torch.load reads it)");
ABSL_FLAG(std::string, summary_json, "",
          "rank 0 writes timings and the final loss here as JSON");
ABSL_FLAG(std::string, sample_log, "",
          "append every micro-batch's sample indices here, one line "
          "'round step epoch rank i,j,...' each (for checking data coverage)");
ABSL_FLAG(bool, float64, false,
          "train in double precision (parameters, data, gradients): runs "
          "whose reductions sum in another order then agree to far below "
          "single precision's rounding (tests comparing runs)");
ABSL_FLAG(std::string, step_log, "",
          "append a line 'round step loss sum' per committed step: its loss "
          "on this rank and the sum of the parameters' absolute values after "
          "its update (for finding where two runs part)");

namespace gradsync {
namespace {

int64_t Bytes(double mib) { return static_cast<int64_t>(mib * (1 << 20)); }

absl::StatusOr<TrainerConfig> TrainerConfigFromFlags() {
  TrainerConfig config;
  for (const std::string& n : absl::GetFlag(FLAGS_rank_batches)) {
    int64_t batches = 0;
    if (!absl::SimpleAtoi(n, &batches)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rank_batches takes comma-separated batch counts, got '", n, "'"));
    }
    config.rank_batches.push_back(batches);
  }
  config.model.kind = absl::GetFlag(FLAGS_model);
  config.model.hidden = absl::GetFlag(FLAGS_hidden);
  config.sync_batchnorm = absl::GetFlag(FLAGS_sync_batchnorm);
  config.dataset = absl::GetFlag(FLAGS_dataset);
  config.data_dir = absl::GetFlag(FLAGS_data_dir);
  config.synthetic_size = absl::GetFlag(FLAGS_synthetic_size);
  config.batch_size = absl::GetFlag(FLAGS_batch_size);
  config.global_batch_size = absl::GetFlag(FLAGS_global_batch_size);
  config.slowdown = absl::GetFlag(FLAGS_slowdown);
  config.slowdown_until_round = absl::GetFlag(FLAGS_slowdown_until_round);
  config.step_sleep = absl::GetFlag(FLAGS_step_sleep);
  config.fingerprint_every = absl::GetFlag(FLAGS_fingerprint_every);
  config.steps = absl::GetFlag(FLAGS_steps);
  config.epochs = absl::GetFlag(FLAGS_epochs);
  config.lr = absl::GetFlag(FLAGS_lr);
  config.momentum = absl::GetFlag(FLAGS_momentum);
  config.shuffle = absl::GetFlag(FLAGS_shuffle);
  config.drop_last = absl::GetFlag(FLAGS_drop_last);
  config.seed = absl::GetFlag(FLAGS_seed);
  GS_ASSIGN_OR_RETURN(config.device,
                      ParseDeviceType(absl::GetFlag(FLAGS_device)));
  config.accumulate = absl::GetFlag(FLAGS_accumulate);
  config.reducer.bucket_cap_bytes =
      std::max<int64_t>(1, Bytes(absl::GetFlag(FLAGS_bucket_cap_mb)));
  config.reducer.first_bucket_bytes =
      std::max<int64_t>(1, Bytes(absl::GetFlag(FLAGS_first_bucket_mb)));
  config.reducer.gradient_as_bucket_view =
      absl::GetFlag(FLAGS_gradient_as_bucket_view);
  config.reducer.find_unused_parameters =
      absl::GetFlag(FLAGS_find_unused_parameters);
  config.reducer.timeout = absl::GetFlag(FLAGS_timeout);
  config.broadcast_buffers = absl::GetFlag(FLAGS_broadcast_buffers);
  config.comm_hook = absl::GetFlag(FLAGS_comm_hook);
  config.powersgd.matrix_approximation_rank = absl::GetFlag(FLAGS_powersgd_rank);
  config.powersgd.start_iter = absl::GetFlag(FLAGS_powersgd_start_iter);
  config.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  config.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  config.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  config.resume = absl::GetFlag(FLAGS_resume);
  config.log_every = absl::GetFlag(FLAGS_log_every);
  config.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  config.load_params = absl::GetFlag(FLAGS_load_params);
  config.save_params = absl::GetFlag(FLAGS_save_params);
  config.sample_log = absl::GetFlag(FLAGS_sample_log);
  config.step_log = absl::GetFlag(FLAGS_step_log);
  config.float64 = absl::GetFlag(FLAGS_float64);
  return config;
}

absl::Status WriteSummary(const std::string& path, const TrainSummary& s,
                          int world_size) {
  auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
  nlohmann::json json = {
      {"world_size", world_size},
      {"steps", s.steps},
      {"parameters", s.parameters},
      {"final_loss", s.final_loss},
      {"mean_step_ms", ms(s.mean_step_time)},
      {"median_step_ms", ms(s.median_step_time)},
      {"samples_per_second", s.samples_per_second},
      {"forward_ms", ms(s.mean_forward)},
      {"backward_ms", ms(s.mean_backward)},
      {"communication_ms", ms(s.mean_communication)},
      {"exposed_communication_ms", ms(s.mean_exposed_communication)},
      {"hidden_communication_ms", ms(s.mean_hidden_communication)},
      {"commit_wait_ms", ms(s.mean_commit_wait)},
      {"update_ms", ms(s.mean_update)},
      {"buckets", s.buckets},
      {"bucket_bytes_per_step", s.bucket_bytes_per_step},
      {"fingerprints", s.fingerprints},
      {"fingerprint_ms", ms(s.mean_fingerprint)},
  };
  std::ofstream out(path, std::ios::trunc);
  out << json.dump(2) << "\n";
  out.close();
  if (!out) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

void PrintDone(const TrainSummary& s) {
  std::printf(
      "done: %lld steps, final loss %.4f, %.0f samples/s, step %.2f ms "
      "(median %.2f)\n",
      static_cast<long long>(s.steps), s.final_loss, s.samples_per_second,
      absl::ToDoubleMilliseconds(s.mean_step_time),
      absl::ToDoubleMilliseconds(s.median_step_time));
  std::fflush(stdout);
}

// gradsync-worker's training loop as RunJob drives it: one TrainingRun for
// the life of the process, trained in round after round, reporting each
// round's steps through the heartbeats. On CUDA the run is created at the
// first round, once the local rank (so the device) is known.
class WorkerTrainer : public Trainer {
 public:
  WorkerTrainer(TrainerConfig config, std::unique_ptr<TrainingRun> run)
      : config_(std::move(config)), run_(std::move(run)) {}

  bool has_state() const override { return run_ != nullptr && run_->has_state(); }
  int64_t committed_step() const override {
    return run_ != nullptr ? run_->committed_step() : 0;
  }

  absl::Status Train(const Round& round) override {
    std::printf("gradsync-worker: rank %d of %d (node %d of %d), round %lld, "
                "backend %s\n",
                round.rank, round.world_size, round.node_rank, round.num_nodes,
                static_cast<long long>(round.number), round.backend_name.c_str());
    std::fflush(stdout);
    if (run_ == nullptr) {
      config_.device_index = round.device_index;
      GS_ASSIGN_OR_RETURN(run_, TrainingRun::Create(config_));
    }
    TrainContext context;
    context.backend = round.backend;
    context.rank = round.rank;
    context.world_size = round.world_size;
    context.source_rank = round.source_rank;
    context.micro_batch_shares = round.micro_batch_shares;
    context.round = round.number;
    context.on_step = round.report_step;
    context.on_round_started = round.report_round_start;
    context.reform_requested = round.reform_requested;
    context.await_round_over = round.await_round_over;
    GS_ASSIGN_OR_RETURN(TrainSummary summary, run_->TrainRound(context));
    if (round.rank != 0) return absl::OkStatus();
    PrintDone(summary);
    const std::string path = absl::GetFlag(FLAGS_summary_json);
    if (path.empty()) return absl::OkStatus();
    return WriteSummary(path, summary, round.world_size);
  }

 private:
  TrainerConfig config_;
  std::unique_ptr<TrainingRun> run_;
};

// Arms --failpoint; the NCCL ones only where the NCCL backend can run.
absl::Status ArmFailpointsFromFlags(v1::DeviceType device) {
  const std::string spec = absl::GetFlag(FLAGS_failpoint);
  if (spec.empty()) return absl::OkStatus();
  GS_RETURN_IF_ERROR(ArmFailpoint(spec));
  GS_ASSIGN_OR_RETURN(const v1::Backend backend,
                      ParseBackend(absl::GetFlag(FLAGS_backend)));
  const bool nccl_possible =
      MayRunNccl(device, backend) && !absl::GetFlag(FLAGS_standalone);
  for (absl::string_view name : {kFailpointNcclAsyncError, kFailpointNcclHang}) {
    if (FailpointArmed(name) && !nccl_possible) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--failpoint=", name, " injects into NCCL collectives: it needs "
          "--device=cuda or --device=sim, a coordinator and a backend other "
          "than gloo"));
    }
  }
  if (FailpointArmed(kFailpointHang) && absl::GetFlag(FLAGS_standalone)) {
    return absl::InvalidArgumentError(
        "--failpoint=hang stands still until the coordinator ends the round: "
        "it needs a coordinator, not --standalone");
  }
  return absl::OkStatus();
}

JobOptions JobOptionsFromFlags(const TrainerConfig& config) {
  JobOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.job = absl::GetFlag(FLAGS_job);
  options.nnodes = absl::GetFlag(FLAGS_nnodes);
  options.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  options.node_id = absl::GetFlag(FLAGS_node_id);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.failure_policy = absl::GetFlag(FLAGS_failure_policy);
  options.divergence_policy = absl::GetFlag(FLAGS_divergence_policy);
  options.straggler_policy = absl::GetFlag(FLAGS_straggler_policy);
  options.straggler_threshold = absl::GetFlag(FLAGS_straggler_threshold);
  options.exact_global_batch = config.global_batch_size > 0;
  options.address = absl::GetFlag(FLAGS_address);
  options.network_interface = absl::GetFlag(FLAGS_network_interface);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.device = config.device;
  if (config.device == v1::DEVICE_TYPE_CUDA) {
    options.device_count = static_cast<int>(torch::cuda::device_count());
  }
  options.nccl_faults = FailpointCommFaults();
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.collective_timeout_factor =
      absl::GetFlag(FLAGS_collective_timeout_factor);
  options.min_collective_timeout = absl::GetFlag(FLAGS_min_collective_timeout);
  options.join_timeout = absl::GetFlag(FLAGS_join_timeout);
  options.last_call_timeout = absl::GetFlag(FLAGS_last_call_timeout);
  options.max_recoveries = absl::GetFlag(FLAGS_max_recoveries);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  return options;
}

absl::Status Run() {
  GS_ASSIGN_OR_RETURN(TrainerConfig config, TrainerConfigFromFlags());
  GS_RETURN_IF_ERROR(ArmFailpointsFromFlags(config.device));
  if (absl::GetFlag(FLAGS_threads) > 0) {
    torch::set_num_threads(absl::GetFlag(FLAGS_threads));
  }
  const std::string summary_path = absl::GetFlag(FLAGS_summary_json);
  if (absl::GetFlag(FLAGS_standalone)) {
    GS_ASSIGN_OR_RETURN(TrainSummary summary, Train(config, TrainContext()));
    PrintDone(summary);
    if (!summary_path.empty()) {
      GS_RETURN_IF_ERROR(WriteSummary(summary_path, summary, 1));
    }
    return absl::OkStatus();
  }
  const JobOptions options = JobOptionsFromFlags(config);
  // On the CPU the run is made now, so bad settings fail before joining; on
  // a GPU (or a simulated one) at the first round, on the process's device.
  std::unique_ptr<TrainingRun> run;
  if (options.device == v1::DEVICE_TYPE_CPU) {
    GS_ASSIGN_OR_RETURN(run, TrainingRun::Create(config));
  }
  WorkerTrainer trainer(config, std::move(run));
  return RunJob(options, &trainer);
}

}  // namespace
}  // namespace gradsync

namespace {

// LibTorch's CPU allocator takes every host tensor from malloc, and glibc
// serves large blocks with mmap and hands freed memory back to the kernel
// at once (munmap, and trimming the heap's top), so every training step
// faults its activations' pages in afresh: ResNet-18 at batch 16 on this
// project's 2-core machines took 400 ms a step that way and 60 ms with the
// memory kept (BENCHMARKS.md). Blocks up to 32 MiB (glibc's largest mmap
// threshold) come from the heap, and the heap keeps up to 1 GiB free.
void KeepFreedHostMemory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace

int main(int argc, char** argv) {
  gradsync::ConfigureMutexChecks();
  KeepFreedHostMemory();
  absl::SetProgramUsageMessage(
      "gradsync-worker --coordinator=HOST:PORT --job=NAME --nnodes=MIN[:MAX] "
      "[--model=mlp|cnn|cnn_bn|resnet18|resnet50] "
      "[--dataset=synthetic|mnist|cifar10] [options]");
  absl::ParseCommandLine(argc, argv);
  absl::Status status = gradsync::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "gradsync-worker: %s\n", status.ToString().c_str());
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
