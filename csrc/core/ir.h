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
//
// Compact form (pattern steps). Some generators (OptCC) repeat the same shape of step Theta(k n)
// times, each with Theta(n) transfers; listing them all costs seconds at n = 1024. Such a step
// is stored as a *pattern step*: its header (round, phase, flags) is an ordinary Step in `steps`,
// but its transfer list is empty and generated on demand from a rule,
//   Step::pattern (index into Schedule::patterns), Step::shift (d), Step::rep (b):
// the pattern's ring is an ordered list of L distinct ranks; position x sends to position
// (x + d) mod L, for every x in order. The pair (u, v) = (ring[x], ring[x+d]) is matched against
// the pattern's lanes by rank class (at most one lane matches a pair of classes). A matching
// lane with delay t is active in repetition b when 0 <= j = b - t < instances; it then yields
//   Transfer{u, v, j * chunk_stride + off + lane.chunk_add, lane.count, lane.op}
// with off = rank_chunk[u] (key kSender), rank_chunk[v] (kReceiver) or 0 (kNone). Pairs with no
// matching or no active lane send nothing. So a ring/shift window of a pipelined schedule is one
// header (O(1) to build), and a rank's part of it is O(1) to compute.
// Every consumer in the library handles both forms and gives the same answers as on the expanded
// schedule: num_rounds / rank_program (O(1) per pattern step) / validate_structure / verify /
// simulate / to_table / to_json (always writes the expanded form, so JSON readers see no
// difference) / relabel / append_steps. Code outside the library must not read
// `steps[i].transfers` directly unless `!is_compact()`: use transfers_of(i, scratch),
// rank_program(), or expanded() (the fully listed equivalent; O(total transfers)).
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

// What a receive does with the data it gets (the transport's receive operation is RecvOp).
// kReduce: x = x (+) received; kReduceFirst: x = received (+) x, the received data as the left
// operand (recursive doubling: both ranks of a pair compute lower (+) upper, so they hold
// bitwise the same result even where (+) is not bitwise commutative, e.g. NaN payloads).
enum class RecvAction : uint8_t { kReduce = 0, kCopy = 1, kReduceFirst = 2 };
inline bool is_reduce(RecvAction op) { return op != RecvAction::kCopy; }

enum class Collective : uint8_t { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };

const char* to_string(RecvAction op);
const char* to_string(Collective c);
Collective collective_from_string(const std::string& s);

// One point-to-point message within a step.
struct Transfer {
  int src = -1;
  int dst = -1;
  int chunk = 0;  // first chunk of the run
  int count = 1;  // number of contiguous chunks
  RecvAction op = RecvAction::kReduce;

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
  // Pattern step (see header comment): >= 0 indexes Schedule::patterns and `transfers` is empty;
  // the transfers are generated for ring shift `shift` (1 <= shift < ring size) and repetition
  // `rep`. -1: an explicit step, `transfers` lists the messages.
  int pattern = -1;
  int shift = 0;
  int rep = 0;
  std::vector<Transfer> transfers;

  bool is_pattern() const { return pattern >= 0; }
};

// One lane of a pattern: which (sender class, receiver class) pairs it serves and what they send.
struct PatternLane {
  enum Key : uint8_t { kSender = 0, kReceiver = 1, kNone = 2 };
  uint32_t src_classes = 0;  // bit c: senders of class c match
  uint32_t dst_classes = 0;  // bit c: receivers of class c match
  Key key = kNone;           // whose rank_chunk entry gives the chunk offset
  int chunk_add = 0;         // added to the offset
  int count = 1;             // chunks per message
  int delay = 0;             // instance j = rep - delay
  RecvAction op = RecvAction::kReduce;
};

// Rule of a pattern step (see the header comment). Build it, then Schedule::add_pattern() checks
// it and fills the derived tables; do not modify a pattern after adding it.
struct Pattern {
  std::vector<int> ring;        // position -> rank, L >= 2 distinct ranks
  std::vector<int> rank_class;  // per rank (size n): class 0..31
  std::vector<int> rank_chunk;  // per rank (size n): chunk offset for keyed lanes
  int chunk_stride = 0;         // chunk = instance * chunk_stride + offset
  int instances = 1;            // instances 0 .. instances-1 exist
  std::vector<PatternLane> lanes;

  // Derived by finalize(): rank -> ring position (-1: not on the ring), class pair -> lane, and
  // per lane and shift whether any pair of the ring matches it.
  std::vector<int> position;
  int num_classes = 0;
  std::vector<int8_t> lane_of_classes;               // [src_class * num_classes + dst_class]
  std::vector<std::vector<uint8_t>> lane_has_pairs;  // [lane][shift]

  // Checks the rule against n ranks and fills the derived tables. Throws ScheduleError.
  void finalize(int n);
  int ring_size() const { return static_cast<int>(ring.size()); }
  // Lane serving the pair (src, dst) of ranks, -1 if none.
  int lane_for(int src, int dst) const {
    return lane_of_classes[rank_class[src] * num_classes + rank_class[dst]];
  }
  // The transfer of lane `lane` from src to dst in repetition rep; false if the lane is inactive.
  bool make_transfer(int lane, int src, int dst, int rep, Transfer* out) const;
  // Appends the transfers of (shift, rep) to out, in ring-position order of the sender.
  void expand(int shift, int rep, std::vector<Transfer>& out) const;
  // Whether (shift, rep) has at least one transfer. O(lanes).
  bool has_transfers(int shift, int rep) const;
  // What `rank` sends / receives in (shift, rep); false if nothing. O(1).
  bool send_of(int rank, int shift, int rep, Transfer* out) const;
  bool recv_of(int rank, int shift, int rep, Transfer* out) const;
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
  RecvAction recv_action = RecvAction::kReduce;
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
  std::vector<Pattern> patterns;       // rules of the pattern steps (compact form), may be empty
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
  // Checks and finalizes a pattern, stores it and returns its index.
  int add_pattern(Pattern p);
  // Appends a pattern step (header only) like add_step.
  Step& add_pattern_step(int pattern, int shift, int rep, int phase, bool pre_arrival = false,
                         bool same_round = false);

  // True if some step is a pattern step.
  bool is_compact() const;
  // Transfers of step i: the step's own list, or the pattern's expansion written into `scratch`.
  const std::vector<Transfer>& transfers_of(size_t i, std::vector<Transfer>& scratch) const;
  // The equivalent fully listed schedule (no pattern steps, no patterns): what the generator
  // would produce without the compact form. O(total transfers).
  Schedule expanded() const;

  double total_weight() const;
  // Lowering: contiguous element ranges for every chunk, sizes proportional to weights
  // (largest-remainder rounding, so they always sum to num_elements).
  std::vector<ElementRange> chunk_ranges(int64_t num_elements) const;
  // Per-rank program (only steps where the rank sends or receives). O(1) per pattern step.
  std::vector<RankOp> rank_program(int rank) const;

  // Structural checks only (indices in range, one send / one receive per rank per step,
  // rounds non-decreasing, round rule). Throws ScheduleError. Data-flow correctness is the
  // verifier's job.
  void validate_structure() const;
};

// Returns a copy where logical rank r becomes perm[r] (perm is a permutation of 0..n-1).
// Pattern steps stay compact (their rings and per-rank tables are relabelled).
Schedule relabel(const Schedule& s, const std::vector<int>& perm);

// Permutation that maps the generators' canonical straggler (rank n-1) to `straggler` and keeps
// the other ranks in order.
std::vector<int> straggler_permutation(int n, int straggler);

// Appends all steps of `tail` after `head` (same n and chunks required); rounds are renumbered;
// tail's patterns are appended to head's.
void append_steps(Schedule& head, const Schedule& tail);

// JSON (nlohmann-json based, see json.cc). Pattern steps are written expanded.
std::string to_json(const Schedule& s, int indent = -1);
Schedule schedule_from_json(const std::string& text);

// Human-readable table: one row per step, one column per rank ("->3 c5+" = send chunk 5 to 3...).
std::string to_table(const Schedule& s, int max_steps = -1);
std::string summary(const Schedule& s);

}  // namespace core
}  // namespace stragg
