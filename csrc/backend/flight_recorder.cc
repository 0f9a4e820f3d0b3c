#include "backend/flight_recorder.h"
#include "backend/text.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace stragg {

struct FlightRecorder::Entry {
  int64_t id = -1;
  std::shared_ptr<FrGroup> group;
  int64_t collective_seq_id = 0;
  int64_t p2p_seq_id = 0;
  int64_t op_id = 0;
  std::string profiling_name;
  int64_t time_created_ns = 0;
  int64_t time_started_ns = -1;    // -1: not known
  int64_t time_completed_ns = -1;  // -1: not completed
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  int64_t timeout_ms = 0;
  bool is_p2p = false;
  int64_t call_seq = -1;  // the session's call number (CallRecord::seq), -1: none
  std::string error;      // why it failed ("" while running or when it succeeded)
  std::string thread_id;
};

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

size_t buffer_size_from_env() {
  const char* v = std::getenv("TORCH_FR_BUFFER_SIZE");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == v || n <= 0) return 0;
  return static_cast<size_t>(n);
}

void describe(const std::vector<at::Tensor>& tensors, std::vector<std::vector<int64_t>>& sizes,
              std::vector<std::string>& dtypes) {
  sizes.reserve(tensors.size());
  dtypes.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    sizes.emplace_back(t.sizes().vec());
    dtypes.emplace_back(c10::toString(t.scalar_type()));
  }
}

c10::IValue sizes_list(const std::vector<std::vector<int64_t>>& sizes) {
  c10::List<c10::List<int64_t>> out;
  for (const auto& s : sizes) out.push_back(c10::List<int64_t>(s));
  return out;
}

c10::IValue string_list(const std::vector<std::string>& v) {
  c10::List<std::string> out;
  for (const auto& s : v) out.push_back(s);
  return out;
}

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
}

std::string pickle_string(const c10::IValue& v) {
  std::vector<char> data = torch::jit::pickle(v);
  return std::string(data.begin(), data.end());
}

}  // namespace

FlightRecorder& FlightRecorder::get() {
  static FlightRecorder* instance = new FlightRecorder();
  return *instance;
}

FlightRecorder::FlightRecorder() : capacity_(buffer_size_from_env()) {}

size_t FlightRecorder::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void FlightRecorder::add_group(const std::shared_ptr<FrGroup>& group) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.erase(std::remove_if(groups_.begin(), groups_.end(),
                               [](const std::weak_ptr<FrGroup>& g) { return g.expired(); }),
                groups_.end());
  groups_.push_back(group);
}

void FlightRecorder::detach_group(const std::shared_ptr<FrGroup>& group) {
  std::lock_guard<std::mutex> lock(mu_);
  group->recent_calls = nullptr;
}

int64_t FlightRecorder::record(const std::shared_ptr<FrGroup>& group, const std::string& desc,
                               const std::string& profiling_name,
                               const std::vector<at::Tensor>& inputs,
                               const std::vector<at::Tensor>& outputs,
                               std::chrono::milliseconds timeout, bool is_p2p) {
  if (!enabled() || !group) return -1;
  Entry e;
  e.group = group;
  if (is_p2p) {
    e.p2p_seq_id = group->p2p_seq.fetch_add(1) + 1;
    e.collective_seq_id = group->collective_seq.load();
  } else {
    e.collective_seq_id = group->collective_seq.fetch_add(1) + 1;
    e.p2p_seq_id = group->p2p_seq.load();
  }
  e.op_id = group->op_seq.fetch_add(1) + 1;
  e.profiling_name = profiling_name;
  e.time_created_ns = now_ns();
  describe(inputs, e.input_sizes, e.input_dtypes);
  describe(outputs, e.output_sizes, e.output_dtypes);
  e.timeout_ms = timeout.count();
  e.is_p2p = is_p2p;
  std::ostringstream tid;
  tid << std::this_thread::get_id();
  e.thread_id = tid.str();
  std::lock_guard<std::mutex> lock(mu_);
  if (!desc.empty() && desc != group->desc) group->desc = desc;
  e.id = next_id_++;
  if (entries_.size() < capacity_) {
    entries_.push_back(std::move(e));
  } else {
    entries_[next_] = std::move(e);
  }
  next_ = (next_ + 1) % capacity_;
  return next_id_ - 1;
}

// The entry of record id `id` if still in the ring (the caller holds mu_).
#define STRAGG_FR_FIND(id)                                                        \
  if ((id) < 0 || entries_.empty()) return;                                       \
  Entry& e = entries_[static_cast<size_t>((id) % static_cast<int64_t>(capacity_))]; \
  if (e.id != (id)) return;

void FlightRecorder::set_call_seq(int64_t id, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  STRAGG_FR_FIND(id)
  e.call_seq = static_cast<int64_t>(seq);
}

void FlightRecorder::finished(int64_t id, const std::string& error) {
  const int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  STRAGG_FR_FIND(id)
  if (e.time_started_ns < 0) e.time_started_ns = e.time_created_ns;
  if (error.empty()) {
    e.time_completed_ns = t;
  } else {
    e.error = error.substr(0, error.find('\n'));
  }
}

#undef STRAGG_FR_FIND

std::vector<FlightRecorder::Entry> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  out.reserve(entries_.size());
  // Oldest first: the ring's slot next_ holds the oldest once it is full.
  const size_t start = entries_.size() < capacity_ ? 0 : next_;
  for (size_t i = 0; i < entries_.size(); ++i) {
    out.push_back(entries_[(start + i) % entries_.size()]);
  }
  return out;
}

std::string FlightRecorder::merge_dump(const std::string& torch_dump, bool include_collectives,
                                       bool only_active) {
  c10::IValue loaded = torch::jit::unpickle(torch_dump.data(), torch_dump.size());
  c10::impl::GenericDict dump = loaded.toGenericDict();
  std::vector<Entry> mine = snapshot();
  std::vector<std::shared_ptr<FrGroup>> groups;
  std::map<const FrGroup*, std::map<int64_t, CallRecord>> calls;
  std::map<const FrGroup*, std::string> descs;  // read under mu_ (record() updates them)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& w : groups_) {
      if (auto g = w.lock()) groups.push_back(g);
    }
    for (const auto& e : mine) descs[e.group.get()] = e.group->desc;
    for (const auto& g : groups) descs[g.get()] = g->desc;
  }
  // The session's records, matched to entries by call number (plan, straggler).
  for (const auto& g : groups) {
    std::function<std::vector<CallRecord>()> read;
    {
      std::lock_guard<std::mutex> lock(mu_);
      read = g->recent_calls;
    }
    if (!read) continue;
    try {
      for (auto& r : read()) calls[g.get()][static_cast<int64_t>(r.seq)] = std::move(r);
    } catch (...) {
      // a session being torn down: no plans in this dump
    }
  }

  // pg_config / pg_status: stragg's groups; torch's own groups kept, except the unnamed entry
  // that stragg's inner Gloo backends register.
  c10::impl::GenericDict pg_config = dump.contains("pg_config")
                                         ? dump.at("pg_config").toGenericDict()
                                         : new_dict();
  c10::impl::GenericDict pg_status = dump.contains("pg_status")
                                         ? dump.at("pg_status").toGenericDict()
                                         : new_dict();
  if (!groups.empty()) pg_config.erase(std::string(""));
  std::map<const FrGroup*, std::array<int64_t, 3>> status;  // enqueued, started, completed
  for (const auto& g : groups) {
    c10::impl::GenericDict c = new_dict();
    c.insert(std::string("name"), g->name);
    c.insert(std::string("desc"), descs[g.get()]);
    c.insert(std::string("ranks"), bracketed(g->global_ranks));
    pg_config.insert_or_assign(g->name, c);
    status[g.get()] = {-1, -1, -1};
  }
  for (const auto& e : mine) {
    auto it = status.find(e.group.get());
    if (it == status.end()) continue;
    it->second[0] = std::max(it->second[0], e.collective_seq_id);
    if (e.time_started_ns >= 0) it->second[1] = std::max(it->second[1], e.collective_seq_id);
    if (e.time_completed_ns >= 0) it->second[2] = std::max(it->second[2], e.collective_seq_id);
  }
  for (const auto& g : groups) {
    const auto& s = status[g.get()];
    c10::impl::GenericDict d = new_dict();
    d.insert(std::string("last_enqueued_collective"), s[0]);
    d.insert(std::string("last_started_collective"), s[1]);
    d.insert(std::string("last_completed_collective"), s[2]);
    pg_status.insert_or_assign(std::to_string(g->pg_id), d);
  }
  dump.insert_or_assign(std::string("pg_config"), pg_config);
  dump.insert_or_assign(std::string("pg_status"), pg_status);
  if (!dump.contains("version")) dump.insert(std::string("version"), std::string("2.10"));

  if (include_collectives) {
    c10::impl::GenericList entries(c10::AnyType::get());
    if (dump.contains("entries")) {
      for (const c10::IValue& v : dump.at("entries").toList()) {
        // Entries of stragg's unnamed inner Gloo backends: stragg records those collectives
        // under its own group.
        if (!groups.empty() && v.isGenericDict()) {
          auto d = v.toGenericDict();
          if (d.contains("process_group")) {
            auto pg = d.at("process_group");
            if (pg.isTuple() && !pg.toTupleRef().elements().empty() &&
                pg.toTupleRef().elements()[0].isString() &&
                pg.toTupleRef().elements()[0].toStringRef().empty()) {
              continue;
            }
          }
        }
        entries.push_back(v);
      }
    }
    // stragg's record ids follow torch's (the analyzer aligns the ranks' traces on record_id).
    for (const auto& e : mine) {
      if (only_active && e.time_completed_ns >= 0) continue;
      c10::impl::GenericDict d = new_dict();
      d.insert(std::string("frames"), c10::impl::GenericList(c10::AnyType::get()));
      d.insert(std::string("record_id"), e.id);
      d.insert(std::string("pg_id"), e.group->pg_id);
      d.insert(std::string("process_group"),
               c10::ivalue::Tuple::create(
                   {c10::IValue(e.group->name), c10::IValue(descs[e.group.get()])}));
      d.insert(std::string("thread_name"), std::string("stragg"));
      d.insert(std::string("thread_id"), e.thread_id);
      d.insert(std::string("collective_seq_id"), e.collective_seq_id);
      d.insert(std::string("p2p_seq_id"), e.p2p_seq_id);
      d.insert(std::string("op_id"), e.op_id);
      d.insert(std::string("profiling_name"), e.profiling_name);
      d.insert(std::string("time_created_ns"), e.time_created_ns);
      d.insert(std::string("input_sizes"), sizes_list(e.input_sizes));
      d.insert(std::string("input_dtypes"), string_list(e.input_dtypes));
      d.insert(std::string("output_sizes"), sizes_list(e.output_sizes));
      d.insert(std::string("output_dtypes"), string_list(e.output_dtypes));
      const bool done = e.time_completed_ns >= 0;
      d.insert(std::string("state"),
               std::string(done ? "completed" : e.time_started_ns >= 0 ? "started" : "scheduled"));
      d.insert(std::string("time_discovered_started_ns"),
               e.time_started_ns >= 0 ? c10::IValue(e.time_started_ns) : c10::IValue());
      d.insert(std::string("time_discovered_completed_ns"),
               done ? c10::IValue(e.time_completed_ns) : c10::IValue());
      d.insert(std::string("retired"), done);
      d.insert(std::string("timeout_ms"), e.timeout_ms);
      d.insert(std::string("is_p2p"), e.is_p2p);
      if (done) {
        d.insert(std::string("duration_ms"),
                 static_cast<double>(e.time_completed_ns - e.time_created_ns) / 1e6);
      }
      c10::impl::GenericDict extra = new_dict();
      // The session's call number ("all_reduce #N" in stragg's messages; unknown for a call
      // that failed before submit returned, whose error names it).
      if (e.call_seq >= 0) extra.insert(std::string("call"), e.call_seq);
      if (!e.error.empty()) extra.insert(std::string("error"), e.error);
      auto g = calls.find(e.group.get());
      if (g != calls.end() && e.call_seq >= 0) {
        auto r = g->second.find(e.call_seq);
        if (r != g->second.end()) {
          extra.insert(std::string("plan"), r->second.schedule_name);
          extra.insert(std::string("algorithm"), r->second.algorithm);
          extra.insert(std::string("straggler"), static_cast<int64_t>(r->second.straggler));
          extra.insert(std::string("wait_s"), r->second.wait_s);
          extra.insert(std::string("run_s"), r->second.run_s);
        }
      }
      d.insert(std::string("stragg"), extra);
      entries.push_back(d);
    }
    dump.insert_or_assign(std::string("entries"), entries);
  }
  return pickle_string(dump);
}

std::string FlightRecorder::dump() {
  return merge_dump(c10d::dump_fr_trace(true, false, false), true, false);
}

void FlightRecorder::on_failure(const std::shared_ptr<FrGroup>& group, const std::string& why) {
  if (!enabled() || !group) return;
  const char* prefix = std::getenv("TORCH_FR_DUMP_TEMP_FILE");
  if (prefix == nullptr || *prefix == '\0') return;
  if (dumped_.exchange(true)) return;
  const std::string path = std::string(prefix) + std::to_string(group->global_rank);
  try {
    const std::string data = dump();
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      throw std::runtime_error("cannot rename " + tmp + " to " + path);
    }
    LOG(WARNING) << "stragg: rank " << group->global_rank << ": flight recorder dump written to "
                 << path << " (" << why.substr(0, why.find('\n')) << ")";
  } catch (const std::exception& e) {
    LOG(ERROR) << "stragg: rank " << group->global_rank
               << ": could not write the flight recorder dump to " << path << ": " << e.what();
  }
}

std::shared_ptr<FrGroup> FlightRecorder::add_group(
    const std::string& name, int rank, int size,
    std::function<std::vector<CallRecord>()> recent_calls) {
  auto group = std::make_shared<FrGroup>();
  group->name = name;
  char* end = nullptr;
  const long long id = std::strtoll(name.c_str(), &end, 10);
  group->pg_id = (end != name.c_str() && *end == '\0')
                     ? id
                     : static_cast<int64_t>(std::hash<std::string>{}(name) & 0x7fffffff);
  for (int r = 0; r < size; ++r) group->global_ranks.push_back(r);
  group->global_rank = rank;
  group->recent_calls = std::move(recent_calls);
  add_group(group);
  return group;
}

void FlightRecorder::finished(const std::shared_ptr<FrGroup>& group, int64_t id,
                              std::exception_ptr error) {
  std::string why;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const c10::Error& e) {
      why = e.msg();
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
      why = "unknown error";
    }
    if (why.empty()) why = "failed";
  }
  finished(id, why);
  if (error) on_failure(group, why);
}

std::string fr_profiling_name(const char* op) {
  static const std::map<std::string, std::string> names = {
      {"all_reduce", "all_reduce"},
      {"all_reduce_coalesced", "allreduce_coalesced"},
      {"sparse all_reduce", "all_reduce"},
      {"barrier", "barrier"},
      {"broadcast", "broadcast"},
      {"reduce", "reduce"},
      {"all_gather", "all_gather"},
      {"all_gather_into_tensor", "all_gather"},  // as torch's Gloo names it
      {"all_gather_coalesced", "ALLGATHER_coalesced"},
      {"all_gather_into_tensor_coalesced", "all_gather_into_tensor_coalesced"},
      {"gather", "gather"},
      {"scatter", "scatter"},
      {"reduce_scatter", "reduce_scatter"},
      {"reduce_scatter_tensor", "_reduce_scatter_base"},
      {"reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced"},
      {"all_to_all_single", "all_to_all_single"},
      {"all_to_all", "all_to_all"},
  };
  auto it = names.find(op);
  return "gloo:" + (it != names.end() ? it->second : std::string(op));
}

}  // namespace stragg
