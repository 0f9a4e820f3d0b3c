#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <random>
#include <sstream>

#include "runtime/error.h"
#include "runtime/host_identity.h"

namespace stragg {
namespace {

constexpr uint64_t kMagic = 0x5354524147475348ull;  // "STRAGGSH"
constexpr size_t kPage = 4096;
constexpr size_t kControlBytes = 2 * kPage;
constexpr size_t kChannelHeaderBytes = kPage;
constexpr size_t kSlotHeaderBytes = 128;
constexpr size_t kAbortMessageBytes = 4000;
// Collectives whose arrival records are kept at once (a rank is never more than one collective
// ahead of the slowest, so a few suffice).
constexpr uint64_t kBoardRounds = 8;

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

std::string errno_text(int err) { return std::string(std::strerror(err)); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds max) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(max.count() / 1000000);
  ts.tv_nsec = static_cast<long>((max.count() % 1000000) * 1000);
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

}  // namespace

struct ShmTransport::ControlBlock {
  uint64_t magic;
  uint64_t nonce;
  int32_t pid;
  int32_t rank;
  int32_t size;
  uint32_t pad0;
  alignas(64) std::atomic<uint32_t> doorbell;  // event count: bumped by anyone who has news
  std::atomic<uint32_t> sleeping;              // owner is (about to be) in futex_wait
  alignas(64) std::atomic<int64_t> arrival;    // last collective sequence number started
  alignas(64) std::atomic<uint32_t> abort_by;  // 0, or 1 + the rank whose message explains it
  std::atomic<uint32_t> own_abort_ready;       // own_abort_message is valid
  char own_abort_message[kAbortMessageBytes];
};

struct ShmTransport::ChannelHeader {
  alignas(64) std::atomic<uint64_t> head;  // slots published by the sender
  alignas(64) std::atomic<uint64_t> tail;  // slots consumed by the receiver
};

struct ShmTransport::SlotHeader {
  MessageHeader message;
  uint64_t offset;  // payload offset of this piece
  uint64_t len;     // payload bytes in this piece
};

// Arrival board in rank 0's segment: a ticket counter, per collective the ranks in arrival order,
// and a decision register. Every collective of the group takes exactly n tickets, and no rank can
// take a ticket for collective k+1 before all n took theirs for k (finishing k needs everybody's
// data), so ticket t belongs to collective t / n at position t % n. Records hold
// ((seq + 1) << 16 | value) so a stale record from kBoardRounds collectives ago is never mistaken.
class ShmTransport::SharedArrivalBoard final : public ArrivalBoard {
 public:
  struct Header {
    alignas(64) std::atomic<uint64_t> tickets;
    alignas(64) std::atomic<uint64_t> decisions[kBoardRounds];
  };

  static size_t bytes(int n) {
    return round_up(sizeof(Header) + kBoardRounds * static_cast<size_t>(n) * sizeof(uint64_t),
                    kPage);
  }

  SharedArrivalBoard(ShmTransport& t, uint8_t* base)
      : t_(t),
        header_(reinterpret_cast<Header*>(base)),
        slots_(reinterpret_cast<std::atomic<uint64_t>*>(base + sizeof(Header))) {}

  int arrive(uint64_t seq) override {
    const int n = t_.size_;
    const uint64_t ticket = header_->tickets.fetch_add(1, std::memory_order_acq_rel);
    const uint64_t k = ticket / n;
    const int pos = static_cast<int>(ticket % n);
    if (k != seq) {
      throw Error("stragg: rank " + std::to_string(t_.rank_) +
                  ": straggler agreement out of sync: arrival ticket for collective #" +
                  std::to_string(k) + " while starting #" + std::to_string(seq));
    }
    slot(seq, pos).store(tag(seq, t_.rank_ + 1), std::memory_order_release);
    for (int r = 0; r < n; ++r) t_.ring_doorbell(r);
    return pos;
  }

  int missing_rank(uint64_t seq) override {
    const int n = t_.size_;
    std::vector<bool> seen(n, false);
    for (int pos = 0; pos < n - 1; ++pos) {
      const uint64_t v = slot(seq, pos).load(std::memory_order_acquire);
      if ((v >> 16) != seq + 1) return -1;
      seen[(v & 0xffff) - 1] = true;
    }
    for (int r = 0; r < n; ++r) {
      if (!seen[r]) return r;
    }
    return -1;
  }

  int decide(uint64_t seq, int proposal) override {
    std::atomic<uint64_t>& d = header_->decisions[seq % kBoardRounds];
    const uint64_t want = tag(seq, proposal + 1);
    uint64_t old = d.load(std::memory_order_acquire);
    while (true) {
      if ((old >> 16) == seq + 1) return static_cast<int>(old & 0xffff) - 1;
      if (d.compare_exchange_weak(old, want, std::memory_order_acq_rel)) break;
    }
    for (int r = 0; r < t_.size_; ++r) t_.ring_doorbell(r);
    return proposal;
  }

  std::optional<int> decision(uint64_t seq) override {
    const uint64_t v = header_->decisions[seq % kBoardRounds].load(std::memory_order_acquire);
    if ((v >> 16) != seq + 1) return std::nullopt;
    return static_cast<int>(v & 0xffff) - 1;
  }

 private:
  static uint64_t tag(uint64_t seq, int value) {
    return ((seq + 1) << 16) | static_cast<uint64_t>(value);
  }
  std::atomic<uint64_t>& slot(uint64_t seq, int pos) {
    return slots_[(seq % kBoardRounds) * t_.size_ + pos];
  }

  ShmTransport& t_;
  Header* header_;
  std::atomic<uint64_t>* slots_;
};

struct ShmTransport::Segment {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  int fd = -1;
  ~Segment() {
    if (base) munmap(base, bytes);
    if (fd >= 0) close(fd);
  }
};

ShmTransport::ShmTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                           const ShmOptions& options)
    : rank_(rank), size_(size), options_(options) {
  static_assert(sizeof(ControlBlock) <= kControlBytes, "control block too large");
  static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes, "slot header too large");
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("stragg: shm transport: invalid rank " + std::to_string(rank) + " of " +
                std::to_string(size));
  }
  options_.slot_bytes = round_up(std::max<size_t>(options_.slot_bytes, kPage), kPage);
  options_.num_slots = std::max<size_t>(options_.num_slots, 1);
  slot_stride_ = kSlotHeaderBytes + options_.slot_bytes;
  channel_stride_ = round_up(kChannelHeaderBytes + options_.num_slots * slot_stride_, kPage);
  board_offset_ = kControlBytes;
  control_bytes_ = kControlBytes + SharedArrivalBoard::bytes(size_);
  segment_bytes_ = control_bytes_ + static_cast<size_t>(size_) * channel_stride_;
  segments_.resize(size_);
  peer_pids_.assign(size_, -1);
  pid_checkable_.assign(size_, false);
  channel_backed_.assign(size_, false);

  std::random_device rd;
  const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  {
    std::ostringstream name;
    name << "/stragg-" << getpid() << "-" << std::hex << nonce << "-r" << std::dec << rank_;
    own_name_ = name.str();
  }
  try {
    auto own = std::make_unique<Segment>();
    own->fd = shm_open(own_name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (own->fd < 0) {
      own_unlinked_ = true;  // nothing to unlink
      throw Error("stragg: rank " + std::to_string(rank_) + ": shm_open(" + own_name_ +
                  ") failed: " + errno_text(errno));
    }
    if (ftruncate(own->fd, static_cast<off_t>(segment_bytes_)) != 0) {
      throw Error("stragg: rank " + std::to_string(rank_) + ": ftruncate of shared memory to " +
                  std::to_string(segment_bytes_) + " bytes failed: " + errno_text(errno));
    }
    // Back the control block and all channel headers now; slot areas are backed on first use
    // (ensure_channel_backed), so channels a schedule never uses cost no memory. posix_fallocate
    // turns "/dev/shm is full" into an error instead of a SIGBUS later.
    int err = posix_fallocate(own->fd, 0, static_cast<off_t>(control_bytes_));
    for (int p = 0; p < size_ && err == 0; ++p) {
      err = posix_fallocate(own->fd, static_cast<off_t>(control_bytes_ + p * channel_stride_),
                            static_cast<off_t>(kChannelHeaderBytes));
    }
    if (err != 0) {
      throw Error("stragg: rank " + std::to_string(rank_) +
                  ": cannot allocate shared memory in /dev/shm: " + errno_text(err));
    }
    void* base =
        mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, own->fd, 0);
    if (base == MAP_FAILED) {
      throw Error("stragg: rank " + std::to_string(rank_) + ": mmap of shared memory failed: " +
                  errno_text(errno));
    }
    own->base = static_cast<uint8_t*>(base);
    own->bytes = segment_bytes_;
    auto* cb = new (own->base) ControlBlock();
    cb->magic = kMagic;
    cb->nonce = nonce;
    cb->pid = getpid();
    cb->rank = rank_;
    cb->size = size_;
    cb->doorbell.store(0);
    cb->sleeping.store(0);
    cb->arrival.store(-1);
    cb->abort_by.store(0);
    cb->own_abort_ready.store(0);
    auto* board = new (own->base + board_offset_) SharedArrivalBoard::Header();
    board->tickets.store(0);
    for (auto& d : board->decisions) d.store(0);
    for (size_t i = 0; i < kBoardRounds * static_cast<size_t>(size_); ++i) {
      new (own->base + board_offset_ + sizeof(SharedArrivalBoard::Header) + i * sizeof(uint64_t))
          std::atomic<uint64_t>(0);
    }
    for (int p = 0; p < size_; ++p) {
      auto* ch = new (own->base + control_bytes_ + p * channel_stride_) ChannelHeader();
      ch->head.store(0);
      ch->tail.store(0);
    }
    segments_[rank_] = std::move(own);

    std::ostringstream info;
    info << own_name_ << "|" << getpid() << "|" << pid_namespace_id() << "|" << options_.slot_bytes
         << "|" << options_.num_slots << "|" << nonce;
    auto infos = exchange_all(rdv, key_prefix + "/shm", rank_, size_, info.str(),
                              options_.setup_timeout, "shm transport setup");
    const std::string my_pidns = std::to_string(pid_namespace_id());
    for (int p = 0; p < size_; ++p) {
      auto f = split(infos[p], '|');
      if (f.size() != 6) {
        throw Error("stragg: rank " + std::to_string(rank_) + ": bad shm setup record from rank " +
                    std::to_string(p) + ": '" + infos[p] + "'");
      }
      if (std::stoull(f[3]) != options_.slot_bytes || std::stoull(f[4]) != options_.num_slots) {
        throw Error("stragg: rank " + std::to_string(rank_) +
                    ": shm staging settings mismatch with rank " + std::to_string(p) + ": " +
                    f[3] + "x" + f[4] + " vs " + std::to_string(options_.slot_bytes) + "x" +
                    std::to_string(options_.num_slots) +
                    " (set STRAGG_SHM_SLOT_BYTES / STRAGG_SHM_SLOTS alike on every rank)");
      }
      peer_pids_[p] = std::stoi(f[1]);
      pid_checkable_[p] = (p != rank_) && f[2] == my_pidns;
      if (p == rank_) continue;
      auto seg = std::make_unique<Segment>();
      int fd = shm_open(f[0].c_str(), O_RDWR, 0600);
      if (fd < 0) {
        throw Error("stragg: rank " + std::to_string(rank_) + ": cannot open rank " +
                    std::to_string(p) + "'s shared memory " + f[0] + ": " + errno_text(errno) +
                    " (are all ranks really on one host? set STRAGG_TRANSPORT to override)");
      }
      seg->fd = fd;
      struct stat st;
      if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != segment_bytes_) {
        throw Error("stragg: rank " + std::to_string(rank_) + ": rank " + std::to_string(p) +
                    "'s shared memory has an unexpected size");
      }
      void* pb = mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (pb == MAP_FAILED) {
        throw Error("stragg: rank " + std::to_string(rank_) + ": mmap of rank " +
                    std::to_string(p) + "'s shared memory failed: " + errno_text(errno));
      }
      close(fd);
      seg->fd = -1;
      seg->base = static_cast<uint8_t*>(pb);
      seg->bytes = segment_bytes_;
      auto* pcb = reinterpret_cast<ControlBlock*>(seg->base);
      if (pcb->magic != kMagic || pcb->rank != p || pcb->size != size_ ||
          std::to_string(pcb->nonce) != f[5]) {
        throw Error("stragg: rank " + std::to_string(rank_) + ": shared memory of rank " +
                    std::to_string(p) + " failed validation (not the same host?)");
      }
      segments_[p] = std::move(seg);
    }
    board_ = std::make_unique<SharedArrivalBoard>(*this, segments_[0]->base + board_offset_);
    exchange_all(rdv, key_prefix + "/shm_mapped", rank_, size_, "1", options_.setup_timeout,
                 "shm transport setup");
    shm_unlink(own_name_.c_str());
    own_unlinked_ = true;
  } catch (...) {
    if (!own_unlinked_) shm_unlink(own_name_.c_str());
    own_unlinked_ = true;
    throw;
  }
}

ShmTransport::~ShmTransport() {
  if (!own_unlinked_) shm_unlink(own_name_.c_str());
}

ShmTransport::ControlBlock* ShmTransport::control(int r) const {
  return reinterpret_cast<ControlBlock*>(segments_[r]->base);
}

ShmTransport::ChannelHeader* ShmTransport::channel(int owner, int peer) const {
  return reinterpret_cast<ChannelHeader*>(segments_[owner]->base + control_bytes_ +
                                          static_cast<size_t>(peer) * channel_stride_);
}

ShmTransport::SlotHeader* ShmTransport::slot(ChannelHeader* ch, uint64_t index) const {
  auto* first = reinterpret_cast<uint8_t*>(ch) + kChannelHeaderBytes;
  return reinterpret_cast<SlotHeader*>(first + (index % options_.num_slots) * slot_stride_);
}

void ShmTransport::ensure_channel_backed(int peer) {
  if (channel_backed_[peer]) return;
  const off_t start = static_cast<off_t>(control_bytes_ + peer * channel_stride_);
  int err = posix_fallocate(segments_[rank_]->fd, start, static_cast<off_t>(channel_stride_));
  if (err != 0) {
    throw Error("stragg: rank " + std::to_string(rank_) +
                ": cannot allocate shared-memory staging for rank " + std::to_string(peer) +
                " in /dev/shm (" + errno_text(err) + "); free space there or lower " +
                "STRAGG_SHM_SLOT_BYTES / STRAGG_SHM_SLOTS");
  }
  channel_backed_[peer] = true;
}

void ShmTransport::ring_doorbell(int r) {
  ControlBlock* cb = control(r);
  cb->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (cb->sleeping.load(std::memory_order_seq_cst) != 0) futex_wake_all(&cb->doorbell);
}

bool ShmTransport::progress(SendOp& op) {
  if (op.done) return false;
  if (op.peer == rank_ || op.peer < 0 || op.peer >= size_) {
    throw Error("stragg: rank " + std::to_string(rank_) + ": invalid send peer " +
                std::to_string(op.peer));
  }
  ensure_channel_backed(op.peer);
  ChannelHeader* ch = channel(rank_, op.peer);
  const size_t total = op.header.payload_bytes;
  bool moved = false;
  uint64_t head = ch->head.load(std::memory_order_relaxed);
  while (!op.done) {
    const uint64_t tail = ch->tail.load(std::memory_order_acquire);
    if (head - tail >= options_.num_slots) break;
    SlotHeader* s = slot(ch, head);
    const size_t len = std::min(options_.slot_bytes, total - op.sent);
    s->message = op.header;
    s->offset = op.sent;
    s->len = len;
    if (len > 0) {
      std::memcpy(reinterpret_cast<uint8_t*>(s) + kSlotHeaderBytes,
                  static_cast<const uint8_t*>(op.data) + op.sent, len);
    }
    ++head;
    ch->head.store(head, std::memory_order_release);
    op.sent += len;
    op.started = true;
    moved = true;
    if (op.sent == total) op.done = true;
  }
  if (moved) ring_doorbell(op.peer);
  return moved;
}

bool ShmTransport::progress(RecvOp& op) {
  if (op.done) return false;
  if (op.peer == rank_ || op.peer < 0 || op.peer >= size_) {
    throw Error("stragg: rank " + std::to_string(rank_) + ": invalid receive peer " +
                std::to_string(op.peer));
  }
  ChannelHeader* ch = channel(op.peer, rank_);
  bool moved = false;
  uint64_t tail = ch->tail.load(std::memory_order_relaxed);
  while (!op.done) {
    const uint64_t head = ch->head.load(std::memory_order_acquire);
    if (tail == head) break;
    SlotHeader* s = slot(ch, tail);
    if (op.received + s->len > op.limit) break;  // would overwrite bytes not sent yet
    if (!op.header_seen) {
      if (s->offset != 0) {
        throw Error("stragg: rank " + std::to_string(rank_) + ": message stream from rank " +
                    std::to_string(op.peer) + " out of sync (piece at offset " +
                    std::to_string(s->offset) + " where a new message should start)");
      }
      op.sink->on_header(s->message);
      op.expected = s->message.payload_bytes;
      op.header_seen = true;
    } else if (s->offset != op.received) {
      throw Error("stragg: rank " + std::to_string(rank_) + ": message stream from rank " +
                  std::to_string(op.peer) + " out of sync (piece at offset " +
                  std::to_string(s->offset) + ", expected " + std::to_string(op.received) + ")");
    }
    if (s->len > 0) {
      op.sink->on_data(s->offset, reinterpret_cast<const uint8_t*>(s) + kSlotHeaderBytes, s->len);
    }
    op.received += s->len;
    ++tail;
    ch->tail.store(tail, std::memory_order_release);
    moved = true;
    if (op.received >= op.expected) op.done = true;
  }
  if (moved) ring_doorbell(op.peer);  // the sender may be waiting for a free slot
  return moved;
}

uint64_t ShmTransport::activity_token() {
  return control(rank_)->doorbell.load(std::memory_order_seq_cst);
}

void ShmTransport::wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) {
  using Clock = std::chrono::steady_clock;
  ControlBlock* cb = control(rank_);
  const uint32_t tok = static_cast<uint32_t>(token);
  const auto start = Clock::now();
  const auto deadline = start + max_wait;
  const auto spin_end = start + std::chrono::microseconds(options_.spin_us);
  const auto yield_end = spin_end + std::chrono::microseconds(options_.yield_us);
  while (Clock::now() < std::min(spin_end, deadline)) {
    for (int i = 0; i < 32; ++i) {
      if (cb->doorbell.load(std::memory_order_acquire) != tok) return;
      cpu_relax();
    }
  }
  while (Clock::now() < std::min(yield_end, deadline)) {
    if (cb->doorbell.load(std::memory_order_acquire) != tok) return;
    sched_yield();
  }
  const auto now = Clock::now();
  if (now >= deadline) return;
  cb->sleeping.store(1, std::memory_order_seq_cst);
  if (cb->doorbell.load(std::memory_order_seq_cst) == tok) {
    futex_wait(&cb->doorbell, tok,
               std::chrono::duration_cast<std::chrono::microseconds>(deadline - now));
  }
  cb->sleeping.store(0, std::memory_order_relaxed);
}

void ShmTransport::signal_abort(const std::string& reason) {
  ControlBlock* own = control(rank_);
  if (own->own_abort_ready.load(std::memory_order_acquire) == 0) {
    const size_t n = std::min(reason.size(), kAbortMessageBytes - 1);
    std::memcpy(own->own_abort_message, reason.data(), n);
    own->own_abort_message[n] = '\0';
    own->own_abort_ready.store(1, std::memory_order_release);
  }
  for (int r = 0; r < size_; ++r) {
    uint32_t expected = 0;
    control(r)->abort_by.compare_exchange_strong(expected, static_cast<uint32_t>(rank_ + 1),
                                                 std::memory_order_acq_rel);
    ring_doorbell(r);
  }
}

std::optional<std::string> ShmTransport::abort_reason() {
  const uint32_t by = control(rank_)->abort_by.load(std::memory_order_acquire);
  if (by == 0) return std::nullopt;
  const int src = static_cast<int>(by) - 1;
  if (src < 0 || src >= size_) return std::string("the group was aborted");
  ControlBlock* cb = control(src);
  if (cb->own_abort_ready.load(std::memory_order_acquire) == 0) {
    return "rank " + std::to_string(src) + " aborted the group";
  }
  return std::string(cb->own_abort_message);
}

std::vector<int> ShmTransport::dead_peers() {
  std::vector<int> dead;
  for (int p = 0; p < size_; ++p) {
    if (pid_checkable_[p] && process_is_dead(peer_pids_[p])) dead.push_back(p);
  }
  return dead;
}

void ShmTransport::announce_arrival(uint64_t coll_seq) {
  control(rank_)->arrival.store(static_cast<int64_t>(coll_seq), std::memory_order_release);
  // No doorbell: arrival tickets are read when diagnosing a timeout, not waited on.
}

int64_t ShmTransport::peer_arrival(int peer) {
  if (peer < 0 || peer >= size_) return -1;
  return control(peer)->arrival.load(std::memory_order_acquire);
}

}  // namespace stragg
