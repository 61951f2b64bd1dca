// What the trainer checks and builds before it trains: the configuration's
// checks, the communication hook it names, and the dataset, checked against
// the model. Errors name TrainerConfig's fields (gradsync-worker's flags
// have the same names). Pure functions of the configuration (the dataset is
// read from disk); thread-safe.
#ifndef GRADSYNC_WORKER_TRAINER_TRAINER_SETUP_H_
#define GRADSYNC_WORKER_TRAINER_TRAINER_SETUP_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/datasets.h"
#include "worker/ddp/comm_hook.h"
#include "worker/trainer/trainer.h"

namespace gradsync {

// INVALID_ARGUMENT naming the field for a configuration that cannot train;
// FAILED_PRECONDITION for device cuda without CUDA.
absl::Status ValidateConfig(const TrainerConfig& config);

// The communication hook `config.comm_hook` names.
absl::StatusOr<std::shared_ptr<CommHook>> MakeCommHook(
    const TrainerConfig& config);

// The dataset `config.dataset` names, checked against the images the model
// takes.
absl::StatusOr<ImageDataset> LoadDataset(const TrainerConfig& config);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TRAINER_TRAINER_SETUP_H_
