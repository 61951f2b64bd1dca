#include "server/heartbeat_shedder.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace gradsync {

HeartbeatShedder::Counts& HeartbeatShedder::Counts::operator+=(
    const Counts& other) {
  heartbeats += other.heartbeats;
  samples += other.samples;
  late += other.late;
  current_samples += other.current_samples;
  current_late += other.current_late;
  return *this;
}

HeartbeatShedder::HeartbeatShedder(HeartbeatSheddingConfig config,
                                   absl::Time start)
    : config_(config),
      window_start_(start),
      probe_after_(std::max(1, config.probe_windows)) {
  state_.enabled = config_.enabled;
}

bool HeartbeatShedder::Overloaded(int64_t all, int64_t part,
                                  int64_t min_all) const {
  return all >= std::max<int64_t>(1, min_all) &&
         static_cast<double>(part) >=
             config_.overloaded_fraction * static_cast<double>(all);
}

void HeartbeatShedder::Update(absl::Time now, const Counts& counts,
                              const Backlog& backlog) {
  absl::MutexLock lock(&mu_);
  window_ += counts;
  backlog_ = backlog;
  window_delay_ = std::max(window_delay_, backlog.delay);
  const bool queued = config_.max_delay > absl::ZeroDuration() &&
                      backlog.delay > config_.max_delay;
  // Heartbeats that opened a stream (no gap to judge).
  const int64_t opened = window_.heartbeats - window_.samples;
  // An episode begins at once: a queue delay, enough late heartbeats so far
  // in the window, or a storm of new streams. It began at least when the
  // oldest event waiting arrived, and the lateness or storm at least with
  // the window.
  if (!state_.behind) {
    Why why = Why::kNone;
    if (queued) {
      why = Why::kQueued;
    } else if (Overloaded(window_.samples, window_.late,
                          config_.min_samples)) {
      why = Why::kLate;
    } else if (opened >= config_.min_samples &&
               Overloaded(window_.heartbeats, opened, config_.min_samples)) {
      why = Why::kOpening;
    }
    if (why != Why::kNone) {
      state_.behind = true;
      state_.behind_since = std::min(window_start_, now - backlog.delay);
      episode_delay_ = absl::ZeroDuration();
      LogEpisodeBeginLocked(now, why);
    }
  }
  if (state_.behind) episode_delay_ = std::max(episode_delay_, backlog.delay);
  if (now - window_start_ < config_.window) return;

  const double seconds = absl::ToDoubleSeconds(now - window_start_);
  const double rate = static_cast<double>(window_.heartbeats) / seconds;
  state_.rate = rate;
  state_.delay = window_delay_;
  state_.late_fraction =
      window_.samples > 0 ? static_cast<double>(window_.late) /
                                static_cast<double>(window_.samples)
                          : 0.0;
  // What the coordinator is late with itself: a queue delay, or late
  // heartbeats.
  const bool processing =
      (config_.max_delay > absl::ZeroDuration() &&
       window_delay_ > config_.max_delay / 4) ||
      (window_.samples >= config_.min_samples &&
       state_.late_fraction > config_.calm_fraction);
  // Overdue members are judged, as late heartbeats are, only over
  // min_samples: among fewer, one dead member would keep an episode going
  // and so stretch its own LOST deadline (by the time behind, up to the
  // cap) long after the load that began the episode has passed.
  // Nor is a window calm while it takes in many new streams.
  const bool opening =
      opened >= config_.min_samples &&
      static_cast<double>(opened) >
          config_.calm_fraction * static_cast<double>(window_.heartbeats);
  const bool calm =
      !processing && !opening &&
      (backlog.members < config_.min_samples ||
       static_cast<double>(backlog.overdue) <=
           config_.calm_fraction * static_cast<double>(backlog.members));
  if (calm && state_.behind) {
    state_.behind = false;
    LogEpisodeEndLocked(now);
  }
  if (config_.enabled) DecideLocked(now, rate, calm, processing);
  window_ = Counts();
  window_delay_ = backlog.delay;
  window_start_ = now;
}

void HeartbeatShedder::LogEpisodeBeginLocked(absl::Time now, Why why) {
  if (now - episode_logged_ < kEpisodeLogEvery) {
    ++episodes_unlogged_[static_cast<size_t>(why)];
    episode_logging_ = false;
    return;
  }
  episode_logged_ = now;
  episode_logging_ = true;
  std::string because;
  switch (why) {
    case Why::kQueued:
      because = absl::StrCat(
          "what arrives waits ",
          absl::FormatDuration(
              absl::Trunc(backlog_.delay, absl::Milliseconds(1))),
          " in its queues");
      break;
    case Why::kLate:
      because = absl::StrFormat("%lld of %lld heartbeats came late",
                                static_cast<long long>(window_.late),
                                static_cast<long long>(window_.samples));
      break;
    case Why::kOpening:
    case Why::kNone:
      because = absl::StrFormat(
          "%lld of %lld heartbeats opened a stream: taking in new streams, "
          "it may read those already open late",
          static_cast<long long>(window_.heartbeats - window_.samples),
          static_cast<long long>(window_.heartbeats));
      break;
  }
  GS_LOG(WARNING) << "the coordinator runs behind its heartbeats (" << because
                  << "): until it catches up, LOST deadlines are extended by "
                     "the time behind"
                  << TakeUnloggedEpisodesLocked();
}

std::string HeartbeatShedder::TakeUnloggedEpisodesLocked() {
  const int64_t queued = episodes_unlogged_[static_cast<size_t>(Why::kQueued)];
  const int64_t late = episodes_unlogged_[static_cast<size_t>(Why::kLate)];
  const int64_t opening = episodes_unlogged_[static_cast<size_t>(Why::kOpening)];
  episodes_unlogged_ = {};
  if (queued + late + opening == 0) return "";
  std::vector<std::string> causes;
  if (queued > 0) causes.push_back(absl::StrCat(queued, " begun by a queue delay"));
  if (late > 0) causes.push_back(absl::StrCat(late, " by late heartbeats"));
  if (opening > 0) causes.push_back(absl::StrCat(opening, " by new streams"));
  return absl::StrCat(" (", queued + late + opening,
                      " shorter episodes were not logged since the last: ",
                      absl::StrJoin(causes, ", "), ")");
}

void HeartbeatShedder::LogEpisodeEndLocked(absl::Time now) {
  if (!episode_logging_) return;
  GS_LOG(INFO) << "the coordinator caught up with its heartbeats after "
               << absl::FormatDuration(absl::Trunc(now - state_.behind_since,
                                                   absl::Milliseconds(1)))
               << " behind (largest queue delay "
               << absl::FormatDuration(
                      absl::Trunc(episode_delay_, absl::Milliseconds(1)))
               << ")";
}

void HeartbeatShedder::DecideLocked(absl::Time now, double rate, bool calm,
                                    bool processing) {
  const int factor = state_.factor;
  // A probe is judged over calm_windows, or, once the load proved more
  // than the asked intervals say, over stuck_windows (staying behind).
  const int verdict_windows =
      headroom_unreliable_
          ? std::max(config_.calm_windows, config_.stuck_windows)
          : config_.calm_windows;
  if (since_probe_ >= 0 && ++since_probe_ > verdict_windows) {
    since_probe_ = -1;  // the probe held
    probe_after_ = std::max(1, config_.probe_windows);
  }
  // Overloaded at the current factor? Then to which factor.
  const char* why = nullptr;
  int target = factor;
  // Heartbeats at the jobs' own intervals, a second.
  const double at_one = backlog_.full_rate;
  // Fewer than min_rate a second cannot be what keeps the coordinator
  // behind (the machine is busy with something else): slowing them would
  // relieve nothing and only delay finding failures. Still behind: the
  // allowance on LOST deadlines stands.
  const bool heartbeats_matter = at_one >= config_.min_rate;
  if (config_.max_delay > absl::ZeroDuration() &&
      backlog_.delay > config_.max_delay && heartbeats_matter) {
    // Saturated: slow down until what members send fits in what the
    // coordinator handled, with headroom; if it fits, it is draining.
    while (target < config_.max_factor &&
           at_one / target > config_.headroom * rate) {
      target = std::min(target * 2, config_.max_factor);
    }
    if (target > factor) why = "heartbeats wait in the coordinator's queues";
  }
  if (why == nullptr &&
      (Overloaded(window_.current_samples, window_.current_late,
                  config_.min_samples) ||
       (state_.behind && Overloaded(backlog_.members, backlog_.overdue,
                                    config_.min_samples)))) {
    why = "heartbeats are handled late or overdue";
    target = std::min(factor * 2, config_.max_factor);
  }
  stuck_ = state_.behind && processing ? stuck_ + 1 : 0;
  // A backlog D deep, arriving within headroom x what is handled, drains
  // within D / (1 - headroom): not stuck before that either.
  const absl::Duration drains_within =
      episode_delay_ / std::max(0.1, 1 - config_.headroom);
  if (why == nullptr && heartbeats_matter && config_.stuck_windows > 0 &&
      stuck_ >= config_.stuck_windows &&
      stuck_ * config_.window >= drains_within &&
      factor < config_.max_factor) {
    why = "the coordinator stays behind its heartbeats at this factor";
    target = std::min(factor * 2, config_.max_factor);
    // What halving would bring back was misjudged (the load is not what
    // the asked intervals say): from now on the factor halves only as a
    // probe (a probe that ends this way doubles the wait for the next,
    // below).
    headroom_unreliable_ = true;
  }
  if (why != nullptr ||
      (config_.max_delay > absl::ZeroDuration() &&
       backlog_.delay > config_.max_delay)) {
    calm_ = 0;
    state_.capacity = rate;  // what it handled while saturated
    if (since_probe_ >= 0) {
      // The probe found no more capacity: wait longer before the next.
      probe_after_ = std::min(probe_after_ * 2,
                              16 * std::max(1, config_.probe_windows));
      since_probe_ = -1;
    }
    if (why != nullptr && target > factor) SetFactorLocked(now, target, why);
    return;
  }
  if (!calm) {
    calm_ = 0;
    return;
  }
  ++calm_;
  state_.capacity = std::max(state_.capacity, rate);
  if (factor == 1 || calm_ < config_.calm_windows) return;
  const bool headroom = !headroom_unreliable_ &&
                        2 * std::max(rate, backlog_.expected_rate) <=
                            config_.headroom * state_.capacity;
  if (!headroom && calm_ < probe_after_) return;
  calm_ = 0;
  since_probe_ = headroom ? -1 : 0;
  if (headroom) probe_after_ = std::max(1, config_.probe_windows);
  SetFactorLocked(now, std::max(1, factor / 2),
                  headroom ? "heartbeats are handled on time with room to spare"
                           : "probing for more capacity");
}

void HeartbeatShedder::SetFactorLocked(absl::Time now, int factor,
                                       const char* why) {
  const int before = state_.factor;
  state_.factor = factor;
  stuck_ = 0;
  if (factor == 1) headroom_unreliable_ = false;  // a new period, afresh
  factor_.store(factor, std::memory_order_relaxed);
  const std::string numbers = absl::StrFormat(
      "last window: %.0f%% of heartbeats late, queue delay %s, %.0f "
      "handled/s of %.0f/s expected; %lld of %lld members overdue; capacity "
      "estimate %.0f/s",
      100 * state_.late_fraction,
      absl::FormatDuration(absl::Trunc(state_.delay, absl::Milliseconds(1))),
      state_.rate, backlog_.expected_rate,
      static_cast<long long>(backlog_.overdue),
      static_cast<long long>(backlog_.members), state_.capacity);
  if (factor > before) {
    if (before == 1) {
      ++state_.shed_periods;
      state_.shedding_since = now;
    }
    GS_LOG(WARNING) << "heartbeat load is past the coordinator's capacity ("
                    << why << "; " << numbers
                    << "): asking workers for heartbeats " << factor
                    << "x their jobs' interval";
  } else if (factor > 1) {
    GS_LOG(INFO) << "heartbeat load eases (" << why << "; " << numbers
                 << "): asking workers for heartbeats " << factor
                 << "x their jobs' interval";
  } else {
    GS_LOG(INFO) << "heartbeat load is within the coordinator's capacity "
                    "again ("
                 << why << "; " << numbers
                 << "): workers heartbeat at their jobs' interval";
  }
}

std::vector<int> HeartbeatShedder::FairFactors(int factor,
                                               const std::vector<double>& rates,
                                               int max_factor) {
  std::vector<int> factors(rates.size(), 1);
  if (factor <= 1) return factors;
  std::vector<size_t> order(rates.size());
  double total = 0;
  for (size_t i = 0; i < rates.size(); ++i) {
    order[i] = i;
    total += rates[i];
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return rates[a] < rates[b]; });
  double budget = total / factor;
  size_t left = rates.size();
  constexpr double kTolerance = 1.25;
  for (size_t i : order) {
    const double share = std::min(rates[i], budget / static_cast<double>(left));
    budget -= share;
    --left;
    while (factors[i] < max_factor && rates[i] / factors[i] > kTolerance * share) {
      factors[i] = std::min(factors[i] * 2, max_factor);
    }
  }
  return factors;
}

HeartbeatShedder::Allowances HeartbeatShedder::Allowed(absl::Time now) const {
  Allowances allowed;
  if (!config_.enabled) return allowed;
  absl::MutexLock lock(&mu_);
  if (!state_.behind) return allowed;
  allowed.all = std::max(now - state_.behind_since, episode_delay_);
  allowed.since = state_.behind_since;
  return allowed;
}

HeartbeatShedder::State HeartbeatShedder::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

}  // namespace gradsync
