// ShmTransport tests: ranks are threads sharing one process. The checks every transport must
// pass are in transport_checks.h; this file adds what is particular to shared memory.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/host_identity.h"
#include "test_util.h"
#include "transport/mixed/peer_stats.h"
#include "transport/shm/shm_transport.h"
#include "transport_checks.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

// Entries this process created ("stragg-<pid>-..."): other test binaries run in parallel.
int count_stragg_shm_entries() {
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  const std::string mine = "stragg-" + std::to_string(getpid()) + "-";
  while (auto* e = readdir(d)) {
    if (std::strncmp(e->d_name, mine.c_str(), mine.size()) == 0) ++n;
  }
  closedir(d);
  return n;
}

testing::MakeTransport shm_maker(const ShmOptions& opt = ShmOptions{}) {
  return [opt](Rendezvous& rdv, int r, int n) {
    return std::make_unique<ShmTransport>(rdv, "shm", r, n, opt);
  };
}

// Two slots of one page: large messages stream through the ring many times over.
ShmOptions tiny_ring() {
  ShmOptions opt;
  opt.slot_bytes = 4096;
  opt.num_slots = 2;
  return opt;
}

TEST(ShmTransport, SetupLeavesNothingInDevShm) {
  const int before = count_stragg_shm_entries();
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, shm_maker());
  EXPECT_EQ(count_stragg_shm_entries(), before);
  for (auto& t : ts) EXPECT_STREQ(t->name(), "shm");
}

TEST(ShmTransport, StatsNameItsStagingAndEveryPeerViaShm) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, shm_maker(tiny_ring()));
  TransportStats stats = ts[1]->stats();
  EXPECT_EQ(stats["shm_slot_bytes"], 4096);
  EXPECT_EQ(stats["shm_slots"], 2);
  EXPECT_EQ(stats.count("oneshot_bytes"), 1u);
  EXPECT_EQ(stats["peer_transport.0"], kPeerViaShm);
  EXPECT_EQ(stats["peer_transport.2"], kPeerViaShm);
  EXPECT_EQ(stats.count("peer_transport.1"), 0u);
  EXPECT_EQ(stats["shm_peers"], 2);
  EXPECT_EQ(stats["tcp_peers"], 0);
}

TEST(ShmTransport, SetupTimesOutNamingTheMissingRanksAndLeavesNothingBehind) {
  ShmOptions opt;
  opt.setup_timeout = std::chrono::milliseconds(300);
  testing::check_setup_names_ranks_that_never_join(shm_maker(opt), count_stragg_shm_entries);
}

TEST(ShmTransport, StreamsLargeAndEmptyMessagesInFifoOrder) {
  std::vector<int> pieces;
  testing::check_streams_messages_in_fifo_order(shm_maker(tiny_ring()), 4096, &pieces);
  // Every slot but a message's last one is full.
  EXPECT_EQ(pieces, (std::vector<int>{38, 0, 1, 2049, 0}));
}

TEST(ShmTransport, FullDuplexExchangeDoesNotDeadlock) {
  ShmOptions opt = tiny_ring();
  opt.num_slots = 1;
  testing::check_full_duplex_exchange(shm_maker(opt), 4096 * 20 + 17);
}

TEST(ShmTransport, AbortReachesEveryRankWithTheFirstReason) {
  testing::check_abort_reaches_every_rank_with_the_first_reason(shm_maker());
}

TEST(ShmTransport, ProgressReportsAreVisibleToPeers) {
  testing::check_progress_reports_are_visible_to_peers(shm_maker());
}

TEST(ShmTransport, WaitReturnsWhenTokenIsStale) {
  testing::check_wait_returns_when_token_is_stale(shm_maker());
}

TEST(ShmTransport, AbortWakesARankSleepingOnItsDoorbell) {
  testing::check_abort_wakes_a_rank_waiting_on_another_peer(shm_maker(), SYS_futex);
}

TEST(ShmTransport, DataWakesASleepingReceiver) {
  testing::check_data_wakes_a_sleeping_receiver(shm_maker(), SYS_futex);
}

TEST(ShmTransport, ARankMayExitBeforeItsLastMessageIsRead) {
  testing::check_a_rank_may_exit_before_its_last_message_is_read(shm_maker());
}

TEST(ShmTransport, AStoppedRankIsNamedByEverySurvivor) {
  const auto errors = testing::check_a_stopped_rank_is_named_by_every_survivor(shm_maker());
  EXPECT_NE(errors[1].find("is stopped: SIGSTOP or a debugger"), std::string::npos) << errors[1];
}

TEST(HostIdentity, IncludesNetworkNamespace) {
  auto id = host_identity();
  EXPECT_NE(id.find("/net:"), std::string::npos);
  EXPECT_EQ(id, host_identity());
  EXPECT_FALSE(process_is_dead(getpid()));
  EXPECT_FALSE(process_is_stopped(getpid()));
  EXPECT_EQ(process_state(getpid()), 'R');
}

}  // namespace
}  // namespace stragg
