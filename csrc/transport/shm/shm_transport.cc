#include "transport/shm/shm_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>

#include "common/error.h"
#include "common/host_identity.h"
#include "transport/common.h"
#include "transport/mixed/peer_stats.h"
#include "transport/shm/arrival_board.h"
#include "transport/shm/channel.h"
#include "transport/shm/doorbell.h"
#include "transport/shm/layout.h"
#include "transport/shm/oneshot_area.h"
#include "transport/shm/segment.h"

namespace stragg {
namespace {

using transport::errno_text;
using transport::rank_prefix;

// What a rank publishes at setup:
// "name|pid|pid namespace|slot_bytes|num_slots|oneshot_bytes|nonce".
struct SetupRecord {
  std::string name;
  int pid = -1;
  std::string pid_namespace;
  size_t slot_bytes = 0;
  size_t num_slots = 0;
  size_t oneshot_bytes = 0;
  std::string nonce;
};

SetupRecord parse_record(int rank, int peer, const std::string& value) {
  const auto f = transport::split(value, '|');
  if (f.size() != 7) {
    throw Error(rank_prefix(rank) + "bad shm setup record from rank " + std::to_string(peer) +
                ": '" + value + "'");
  }
  return SetupRecord{f[0],           std::stoi(f[1]),  f[2], std::stoull(f[3]),
                     std::stoull(f[4]), std::stoull(f[5]), f[6]};
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Setup

ShmTransport::ShmTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                           const ShmOptions& options)
    : GroupTransport("shm", rank, size), options_(options) {
  options_.slot_bytes =
      transport::round_up(std::max<size_t>(options_.slot_bytes, shm::kPage), shm::kPage);
  options_.num_slots = std::max<size_t>(options_.num_slots, 1);
  options_.oneshot_bytes = transport::round_up(options_.oneshot_bytes, shm::kPage);
  layout_ = std::make_unique<shm::Layout>(options_.slot_bytes, options_.num_slots, size_,
                                          options_.oneshot_bytes);
  segments_.resize(size_);
  peer_pids_.assign(size_, -1);
  pid_checkable_.assign(size_, false);
  channel_backed_.assign(size_, false);

  std::random_device rd;
  const uint64_t nonce =
      (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  std::ostringstream name;
  name << "/stragg-" << getpid() << "-" << std::hex << nonce << "-r" << std::dec << rank_;
  create_own_segment(name.str(), nonce);
  map_peer_segments(rdv, key_prefix, name.str(), nonce);
  board_ = std::make_unique<shm::SharedArrivalBoard>(
      segments_[0]->base() + layout_->board_offset, rank_, size_, [this] { ring_all_doorbells(); });
  if (options_.oneshot_bytes > 0) {
    std::vector<uint8_t*> bases;
    for (const auto& seg : segments_) bases.push_back(seg->base());
    oneshot_ = std::make_unique<shm::ShmOneshotArea>(*layout_, std::move(bases), rank_, [this] {
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) ring_doorbell(r);
      }
    });
  }
  exchange_all(rdv, key_prefix + "/shm_mapped", rank_, size_, "1", options_.setup_timeout,
               "shm transport setup");
  segments_[rank_]->unlink();
}

ShmTransport::~ShmTransport() = default;

void ShmTransport::create_own_segment(const std::string& name, uint64_t nonce) {
  auto own = shm::Segment::create(name, layout_->segment_bytes, rank_);
  // Back the control block and all channel headers now; slot areas are backed on first use
  // (ensure_channel_backed), so channels a schedule never uses cost no memory.
  int err = own->back(0, layout_->control_bytes);
  for (int p = 0; p < size_ && err == 0; ++p) {
    err = own->back(layout_->channel_offset(p), shm::kChannelHeaderBytes);
  }
  if (err != 0) {
    throw Error(rank_prefix(rank_) +
                "cannot allocate shared memory in /dev/shm: " + errno_text(err));
  }
  layout_->initialize(own->base(), nonce, getpid(), rank_, size_);
  segments_[rank_] = std::move(own);
}

void ShmTransport::map_peer_segments(Rendezvous& rdv, const std::string& key_prefix,
                                     const std::string& own_name, uint64_t nonce) {
  std::ostringstream info;
  info << own_name << "|" << getpid() << "|" << pid_namespace_id() << "|" << options_.slot_bytes
       << "|" << options_.num_slots << "|" << options_.oneshot_bytes << "|" << nonce;
  const auto infos = exchange_all(rdv, key_prefix + "/shm", rank_, size_, info.str(),
                                  options_.setup_timeout, "shm transport setup");
  const std::string my_pidns = std::to_string(pid_namespace_id());
  for (int p = 0; p < size_; ++p) {
    const SetupRecord r = parse_record(rank_, p, infos[p]);
    if (r.slot_bytes != options_.slot_bytes || r.num_slots != options_.num_slots) {
      throw Error(rank_prefix(rank_) + "shm staging settings mismatch with rank " +
                  std::to_string(p) + ": " + std::to_string(r.slot_bytes) + "x" +
                  std::to_string(r.num_slots) + " vs " + std::to_string(options_.slot_bytes) + "x" +
                  std::to_string(options_.num_slots) +
                  " (set STRAGG_SHM_SLOT_BYTES / STRAGG_SHM_SLOTS alike on every rank)");
    }
    if (r.oneshot_bytes != options_.oneshot_bytes) {
      throw Error(rank_prefix(rank_) + "STRAGG_ONESHOT_BYTES mismatch with rank " +
                  std::to_string(p) + ": " + std::to_string(r.oneshot_bytes) + " bytes (rank " +
                  std::to_string(p) + ") vs " + std::to_string(options_.oneshot_bytes) +
                  " bytes (rank " + std::to_string(rank_) + "); set it alike on every rank");
    }
    peer_pids_[p] = r.pid;
    pid_checkable_[p] = (p != rank_) && r.pid_namespace == my_pidns;
    if (p != rank_) map_peer_segment(p, r.name, r.nonce);
  }
}

void ShmTransport::map_peer_segment(int peer, const std::string& name, const std::string& nonce) {
  auto seg = shm::Segment::open(name, layout_->segment_bytes, rank_, peer);
  const shm::ControlBlock* cb = layout_->control(seg->base());
  if (cb->magic != shm::kMagic || cb->rank != peer || cb->size != size_ ||
      std::to_string(cb->nonce) != nonce) {
    throw Error(rank_prefix(rank_) + "shared memory of rank " + std::to_string(peer) +
                " failed validation (not the same host?)");
  }
  segments_[peer] = std::move(seg);
}

size_t ShmTransport::channel_bytes() const { return layout_->channel_stride; }

TransportStats ShmTransport::stats() const {
  TransportStats s;
  s["shm_slot_bytes"] = static_cast<int64_t>(options_.slot_bytes);
  s["shm_slots"] = static_cast<int64_t>(options_.num_slots);
  s["oneshot_bytes"] = static_cast<int64_t>(options_.oneshot_bytes);
  add_peer_transport_stats(rank_, size_, [](int) { return true; }, s);
  return s;
}

shm::ControlBlock* ShmTransport::control(int r) const {
  return layout_->control(segments_[r]->base());
}

void ShmTransport::ring_doorbell(int r) { shm::ring(control(r)); }

void ShmTransport::ring_all_doorbells() {
  for (int r = 0; r < size_; ++r) ring_doorbell(r);
}

// ------------------------------------------------------------------------------------------------
// Messages

void ShmTransport::ensure_channel_backed(int peer) {
  if (channel_backed_[peer]) return;
  const int err = segments_[rank_]->back(layout_->channel_offset(peer), layout_->channel_stride);
  if (err != 0) {
    throw Error(rank_prefix(rank_) + "cannot allocate shared-memory staging for rank " +
                std::to_string(peer) + " in /dev/shm (" + errno_text(err) +
                "); free space there or lower STRAGG_SHM_SLOT_BYTES / STRAGG_SHM_SLOTS");
  }
  channel_backed_[peer] = true;
}

bool ShmTransport::progress(SendOp& op) {
  if (op.done) return false;
  check_peer(op.peer, "send");
  ensure_channel_backed(op.peer);
  const bool moved =
      shm::send_pieces(*layout_, layout_->channel(segments_[rank_]->base(), op.peer), op);
  if (moved) ring_doorbell(op.peer);
  return moved;
}

bool ShmTransport::progress(RecvOp& op) {
  if (op.done) return false;
  check_peer(op.peer, "receive");
  const bool moved =
      shm::receive_pieces(*layout_, layout_->channel(segments_[op.peer]->base(), rank_), op, rank_);
  if (moved) ring_doorbell(op.peer);  // the sender may be waiting for a free slot
  return moved;
}

uint64_t ShmTransport::activity_token() {
  return control(rank_)->doorbell.load(std::memory_order_seq_cst);
}

void ShmTransport::wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) {
  shm::wait_for_ring(control(rank_), static_cast<uint32_t>(token), max_wait, options_.spin_us,
                     options_.yield_us);
}

void ShmTransport::sleep_for_activity(uint64_t token, std::chrono::microseconds max_wait) {
  shm::wait_for_ring(control(rank_), static_cast<uint32_t>(token), max_wait, 0, 0);
}

// ------------------------------------------------------------------------------------------------
// Faults and diagnostics

void ShmTransport::signal_abort(const std::string& reason) {
  shm::ControlBlock* own = control(rank_);
  if (own->own_abort_ready.load(std::memory_order_acquire) == 0) {
    const size_t n = std::min(reason.size(), shm::kAbortMessageBytes - 1);
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
  shm::ControlBlock* cb = control(src);
  if (cb->own_abort_ready.load(std::memory_order_acquire) == 0) {
    return "rank " + std::to_string(src) + " aborted the group";
  }
  return std::string(cb->own_abort_message);
}

std::vector<int> ShmTransport::dead_peers() {
  std::vector<int> dead;
  for (int p = 0; p < size_; ++p) {
    if (!pid_checkable_[p] || !process_is_dead(peer_pids_[p])) continue;
    // What it sent before it exited stays readable (its segment is still mapped here).
    const shm::ChannelHeader* ch = layout_->channel(segments_[p]->base(), rank_);
    if (ch->head.load(std::memory_order_acquire) == ch->tail.load(std::memory_order_acquire)) {
      dead.push_back(p);
    }
  }
  return dead;
}

std::vector<int> ShmTransport::gone_peers() {
  std::vector<int> gone;
  for (int p = 0; p < size_; ++p) {
    if (pid_checkable_[p] && process_is_dead(peer_pids_[p])) gone.push_back(p);
  }
  return gone;
}

void ShmTransport::publish_progress(const Progress& progress) {
  shm::write_progress(control(rank_)->progress, progress);
  // No doorbell: progress is read when diagnosing a stall, not waited on.
}

PeerStatus ShmTransport::peer_status(int peer) {
  PeerStatus s;
  if (peer < 0 || peer >= size_) return s;
  s.progress = shm::read_progress(control(peer)->progress, size_);
  if (peer == rank_ || !pid_checkable_[peer]) return s;
  if (process_is_dead(peer_pids_[peer])) {
    s.liveness = Liveness::Dead;
  } else if (process_is_stopped(peer_pids_[peer])) {
    s.liveness = Liveness::Stopped;
    s.evidence =
        "its process " + std::to_string(peer_pids_[peer]) + " is stopped: SIGSTOP or a debugger";
  }
  return s;
}

}  // namespace stragg
