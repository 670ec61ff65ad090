//go:build clusters

package clusters

import (
	"os"
	"testing"
)

// A finding is a failure of warden that these tests found and that must be
// fixed in warden, not here. The scenario that shows it is skipped, naming
// the finding, so that the suite stays usable meanwhile; with
// WARDEN_CLUSTERS_FINDINGS=1 it runs, and fails until the fix lands. Remove
// the knownFinding call once it passes.
type finding struct {
	id      string
	summary string
}

var (
	findingEtcdFrozenWatch = finding{"etcd-frozen-watch",
		"etcdlock: a waiter whose watch stream is on a frozen (SIGSTOPped) member never sees its predecessor's " +
			"deletion, so the FIFO queue behind it stalls for as long as the member stays frozen"}
	findingEtcdReleaseDuringElection = finding{"etcd-release-during-election",
		"etcdlock: a release caught by a leader kill either fails at once (connection reset; not retried, " +
			"though the delete is conditional and safe to retry) or waits out the 5s request timeout while the " +
			"session's keepalive keeps the lock taken; the session's one best-effort revoke fails during the " +
			"election, so the lease lives on until about TTL+1s after the new leader (etcd extends leases on " +
			"promotion): 4-5.7s without a grant after the kill, against max(TTL, election)+1s = 3s"}
	findingRedisFairGhosts = finding{"redis-fair-ghost-waiters",
		"redislock fair mode: a replica promoted after missing the latest grants still queues the waiters " +
			"those grants let in; live waiters queue behind these ghosts until their places lapse (the waiter " +
			"timeout, 5s, after the lost writes) and notice only at their next renewal (every 1.67s), so the lock " +
			"comes back 1.7-2.4s after the promotion, beyond failover+1s"}
	findingZKFrozenHandshake = finding{"zk-frozen-handshake",
		"zklock: after a frozen (SIGSTOPped) leader, the lock was first not granted for ~24s (go-zookeeper's " +
			"handshake deadline held clients on the frozen server); with the handshake capped at a sixth of the " +
			"session timeout and faster release retries it comes back 4.0-4.5s after the freeze, against a bound " +
			"of about 4.3s (the ensemble serving again plus 1s): the client's reconnection after the election " +
			"still takes up to a second too long"}
)

func knownFinding(t *testing.T, f finding) {
	t.Helper()
	if os.Getenv("WARDEN_CLUSTERS_FINDINGS") == "" {
		t.Skipf("known warden finding %s: %s (WARDEN_CLUSTERS_FINDINGS=1 runs it)", f.id, f.summary)
	}
}
