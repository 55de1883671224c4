#include "server_metrics.h"

#include <algorithm>
#include <cstdio>

namespace bps {
namespace {

constexpr const char* kPrefix = "tf_bps_server_";

void Family(std::string* out, const char* name, const char* type, const char* help) {
  *out += std::string("# HELP ") + kPrefix + name + " " + help + "\n# TYPE " + kPrefix + name +
          " " + type + "\n";
}

void Sample(std::string* out, const std::string& name, const std::string& labels,
            const std::string& value) {
  *out += kPrefix + name + labels + " " + value + "\n";
}

std::string Seconds(uint64_t ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9f", static_cast<double>(ns) / 1e9);
  return text;
}

}  // namespace

std::vector<ServerMetrics::Rank*> ServerMetrics::Ranks(int num_workers) {
  std::lock_guard<std::mutex> lock(mutex_);
  while (ranks_.size() < static_cast<size_t>(num_workers))
    ranks_.push_back(std::make_unique<Rank>());
  std::vector<Rank*> ranks;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ranks_[r]->straggler.store(false);
    if (r < static_cast<size_t>(num_workers)) ranks.push_back(ranks_[r].get());
  }
  workers_.store(num_workers);
  return ranks;
}

std::string ServerMetrics::Render() const {
  const uint64_t rounds = rounds_.load(std::memory_order_acquire);
  std::string out;
  Family(&out, "received_bytes_total", "counter",
         "Payload bytes of the frames received from workers (pushes, declarations, joins).");
  Sample(&out, "received_bytes_total", "", std::to_string(received_bytes_.load()));
  Family(&out, "sent_bytes_total", "counter",
         "Payload bytes of the frames sent to workers (results, acknowledgements, errors).");
  Sample(&out, "sent_bytes_total", "", std::to_string(sent_bytes_.load()));
  Family(&out, "rounds_total", "counter",
         "Rounds finished: one per partition and step whose result was sent to its workers.");
  Sample(&out, "rounds_total", "", std::to_string(rounds));
  Family(&out, "queue_depth", "gauge",
         "Pushes and other items queued for the engine threads, not yet taken.");
  // Each engine counts an item in before it counts it out, under its queue's lock, so
  // the sum never dips below 0; the clamp only guards the text.
  Sample(&out, "queue_depth", "", std::to_string(std::max<int64_t>(0, queue_depth_.load())));
  Family(&out, "workers", "gauge", "Workers in the address book of the job's generation.");
  Sample(&out, "workers", "", std::to_string(workers_.load()));

  std::lock_guard<std::mutex> lock(mutex_);
  Family(&out, "push_lateness_seconds", "summary",
         "How long after the first push of its round each push of a worker arrived.");
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const std::string labels = "{worker_rank=\"" + std::to_string(r) + "\"}";
    Sample(&out, "push_lateness_seconds_sum", labels, Seconds(ranks_[r]->late_ns.load()));
    Sample(&out, "push_lateness_seconds_count", labels, std::to_string(ranks_[r]->pushes.load()));
  }
  Family(&out, "straggler", "gauge",
         "1 for a worker the straggler watch named in the last window it judged, else 0.");
  for (size_t r = 0; r < ranks_.size(); ++r)
    Sample(&out, "straggler", "{worker_rank=\"" + std::to_string(r) + "\"}",
           ranks_[r]->straggler.load() ? "1" : "0");
  return out;
}

}  // namespace bps
