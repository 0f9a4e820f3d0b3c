#include "transport/shm/layout.h"

#include <new>

#include "transport/common.h"
#include "transport/shm/arrival_board.h"

namespace stragg::shm {

Layout::Layout(size_t slot_bytes_, size_t num_slots_, int size)
    : slot_bytes(slot_bytes_),
      num_slots(num_slots_),
      slot_stride(kSlotHeaderBytes + slot_bytes_),
      channel_stride(transport::round_up(kChannelHeaderBytes + num_slots_ * slot_stride, kPage)),
      board_offset(kControlBytes),
      control_bytes(kControlBytes + SharedArrivalBoard::bytes(size)),
      segment_bytes(control_bytes + static_cast<size_t>(size) * channel_stride) {}

void Layout::initialize(uint8_t* base, uint64_t nonce, int pid, int rank, int size) const {
  auto* cb = new (base) ControlBlock();
  cb->magic = kMagic;
  cb->nonce = nonce;
  cb->pid = pid;
  cb->rank = rank;
  cb->size = size;
  cb->doorbell.store(0);
  cb->sleeping.store(0);
  cb->arrival.store(-1);
  cb->abort_by.store(0);
  cb->own_abort_ready.store(0);
  SharedArrivalBoard::initialize(base + board_offset, size);
  for (int p = 0; p < size; ++p) {
    auto* ch = new (base + channel_offset(p)) ChannelHeader();
    ch->head.store(0);
    ch->tail.store(0);
  }
}

}  // namespace stragg::shm
