// Streaming messages through a channel of the shared-memory transport: the ring of slots in the
// sender's segment through which it sends to one peer (layout.h). The sender copies a message
// piece by piece into free slots (each slot carries the MessageHeader, the piece's offset and
// length) and publishes them by advancing `head`; the receiver hands each piece straight from
// the slot to its sink (reducing or copying into its own buffer, so a piece crosses memory
// once) and frees it by advancing `tail`. Staging memory per channel is therefore bounded by
// num_slots * slot_bytes whatever the message size. Callers ring the peer's doorbell when
// anything moved.
#pragma once

#include "transport/shm/layout.h"
#include "transport/transport.h"

namespace stragg::shm {

// Copies as many pieces of `op` into free slots of `ch` as fit. True if any did.
bool send_pieces(const Layout& layout, ChannelHeader* ch, SendOp& op);

// Hands the published pieces of `op`'s message in `ch` to its sink, within op.limit. True if
// any moved. Throws stragg::Error naming `rank` and op.peer if the stream is out of sync (and
// whatever the sink throws).
bool receive_pieces(const Layout& layout, ChannelHeader* ch, RecvOp& op, int rank);

}  // namespace stragg::shm
