// gradsync's DistributedDataParallel for LibTorch training loops of your own:
// the public header (link //gradsync in Bazel, gradsync::gradsync in CMake).
//
//   auto model = MakeMyModel();                                  // BatchNorm inside
//   GS_RETURN_IF_ERROR(gradsync::ConvertSyncBatchNorm(model.ptr()).status());
//   auto ddp = gradsync::DistributedDataParallel::Create(model, round.backend);
//   (*ddp)->RegisterCommHook(std::make_shared<gradsync::CompressHook>(torch::kHalf));
//   torch::Tensor loss = loss_fn((*ddp)->forward(x), y);        // ddp(x)
//   loss.backward();                                            // averaged, overlapped
//   GS_RETURN_IF_ERROR((*ddp)->CheckStep());  // every all-reduce good (GPUs)
//   optimizer.step();
//
// What it holds:
//   DistributedDataParallel, DdpOptions        worker/ddp/distributed_data_parallel.h
//   CommHook, AllReduceHook, CompressHook      worker/ddp/comm_hook.h
//   PowerSgdHook, PowerSgdOptions              worker/ddp/powersgd_hook.h
//   SyncBatchNorm, ConvertSyncBatchNorm        worker/ddp/sync_batch_norm.h
//   UnevenInputs (PyTorch's Join)              worker/ddp/uneven_inputs.h
//   state dicts ("module." both ways)          worker/ddp/state_dict.h
//   checkpoints (torch.load reads them)        worker/ddp/checkpoint.h
//   BroadcastTrainingState (recovered rounds)  worker/ddp/training_state.h
//   DistributedSampler (PyTorch's indices)     worker/data/distributed_sampler.h
//   ... as a torch::data sampler               worker/data/torch_sampler.h
#ifndef GRADSYNC_GRADSYNC_DDP_H_
#define GRADSYNC_GRADSYNC_DDP_H_

#include "worker/data/distributed_sampler.h"
#include "worker/data/torch_sampler.h"
#include "worker/ddp/checkpoint.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/distributed_data_parallel.h"
#include "worker/ddp/powersgd_hook.h"
#include "worker/ddp/state_dict.h"
#include "worker/ddp/sync_batch_norm.h"
#include "worker/ddp/training_state.h"
#include "worker/ddp/uneven_inputs.h"

#endif  // GRADSYNC_GRADSYNC_DDP_H_
