// Schedule IR: the one data structure every generator produces and every consumer (verifier,
// simulator, printer, JSON, runtime executor) reads. Torch-free, CUDA-free.
//
// Model (one-port, full-duplex; StragglAR §3, OptCC §4):
//  * n ranks; the user buffer is split into C contiguous chunks (chunk c is the c-th slice, its
//    size proportional to chunk_weights[c]). k pipelined segments are just more chunks.
//  * A schedule is a sequence of steps. In a step every rank sends at most one message and
//    receives at most one message. A message carries a contiguous run of chunks
//    [chunk, chunk + count) and is either reduced into (sum) or copied over the receiver's slice.
//  * Semantics of a step: every send reads the sender's data as it was at the start of the step;
//    receives are applied at the end of the step (so a pairwise exchange of the same chunk is fine;
//    an executor must receive into a staging buffer before reducing).
//  * Consecutive steps may share a `round`: they are issued concurrently and share the ports'
//    bandwidth (MSCCL allpairs, OptCC's merged flows). Within a round a rank must not send a chunk
//    it receives in another step of the same round, so sequential and concurrent execution agree.
//    The alpha cost is paid once per round.
//  * Steps carry a phase (index into Schedule::phases) and a pre_arrival flag: pre-arrival steps
//    never involve the straggler and can run while it is still computing (StragglAR's
//    reduce-scatter among the n-1 early ranks).
//  * rank_slowdown[r] >= 1 scales the time of every transfer to or from r (a degraded link).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace stragg {
namespace core {

// All errors raised by the schedule library derive from this.
class ScheduleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class RecvOp : uint8_t { kReduce = 0, kCopy = 1 };

enum class Collective : uint8_t { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };

const char* to_string(RecvOp op);
const char* to_string(Collective c);
Collective collective_from_string(const std::string& s);

// One point-to-point message within a step.
struct Transfer {
  int src = -1;
  int dst = -1;
  int chunk = 0;  // first chunk of the run
  int count = 1;  // number of contiguous chunks
  RecvOp op = RecvOp::kReduce;

  bool operator==(const Transfer& o) const {
    return src == o.src && dst == o.dst && chunk == o.chunk && count == o.count && op == o.op;
  }
};

struct Step {
  int round = 0;  // steps sharing a round are concurrent (see header comment)
  int phase = 0;  // index into Schedule::phases
  bool pre_arrival = false;
  // Topology hint for the ring-topology cost model: the step runs on reconfigured direct
  // circuits (short-circuit-rings §3). Ignored by the verifier and by executors.
  bool reconfigure = false;
  std::vector<Transfer> transfers;
};

// Per-rank view of one step, what an executor consumes.
struct RankOp {
  int step = 0;
  int round = 0;
  int phase = 0;
  bool pre_arrival = false;
  bool has_send = false;
  int send_peer = -1, send_chunk = 0, send_count = 0;
  bool has_recv = false;
  int recv_peer = -1, recv_chunk = 0, recv_count = 0;
  RecvOp recv_op = RecvOp::kReduce;
};

// Element range of a chunk after lowering onto a buffer of num_elements elements.
struct ElementRange {
  int64_t offset = 0;
  int64_t length = 0;
};

struct Schedule {
  std::string algorithm;  // "ring", "stragglar", ...
  Collective collective = Collective::kAllReduce;
  int n = 0;
  int num_chunks = 0;
  int segments = 1;                    // k pipelined segments (informational; chunks already include them)
  std::vector<double> chunk_weights;   // size num_chunks, > 0
  std::vector<int> chunk_owner;        // size num_chunks; RS output / AG input owner, -1 = none
  std::vector<std::string> phases;     // phase names, at least one
  std::vector<int> stragglers;         // ranks the schedule was built around (may be empty)
  std::vector<double> rank_slowdown;   // size n, >= 1
  std::vector<Step> steps;
  std::string params_json = "{}";      // generator parameters, for provenance

  // Creates an empty schedule with equal chunk weights, one phase "main", no slowdown.
  static Schedule make(const std::string& algorithm, Collective collective, int n, int num_chunks);

  int num_steps() const { return static_cast<int>(steps.size()); }
  // Number of distinct rounds (alpha terms) in the schedule.
  int num_rounds() const;
  // Rounds that contain at least one non-pre-arrival step.
  int num_post_arrival_rounds() const;
  int phase_index(const std::string& name);  // adds the phase if missing

  // Appends a step (with a new round unless same_round is true) and returns it.
  Step& add_step(int phase, bool pre_arrival = false, bool same_round = false);

  double total_weight() const;
  // Lowering: contiguous element ranges for every chunk, sizes proportional to weights
  // (largest-remainder rounding, so they always sum to num_elements).
  std::vector<ElementRange> chunk_ranges(int64_t num_elements) const;
  // Per-rank program (only steps where the rank sends or receives).
  std::vector<RankOp> rank_program(int rank) const;

  // Structural checks only (indices in range, one send / one receive per rank per step,
  // rounds non-decreasing, round rule). Throws ScheduleError. Data-flow correctness is the
  // verifier's job.
  void validate_structure() const;
};

// Returns a copy where logical rank r becomes perm[r] (perm is a permutation of 0..n-1).
Schedule relabel(const Schedule& s, const std::vector<int>& perm);

// Permutation that maps the generators' canonical straggler (rank n-1) to `straggler` and keeps
// the other ranks in order.
std::vector<int> straggler_permutation(int n, int straggler);

// Appends all steps of `tail` after `head` (same n and chunks required); rounds are renumbered.
void append_steps(Schedule& head, const Schedule& tail);

// JSON (nlohmann-json based, see json.cc).
std::string to_json(const Schedule& s, int indent = -1);
Schedule schedule_from_json(const std::string& text);

// Human-readable table: one row per step, one column per rank ("->3 c5+" = send chunk 5 to 3...).
std::string to_table(const Schedule& s, int max_steps = -1);
std::string summary(const Schedule& s);

}  // namespace core
}  // namespace stragg
