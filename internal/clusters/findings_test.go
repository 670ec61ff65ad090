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
	findingEtcdFrozenWatch = finding{"etcd-frozen-member",
		"etcdlock: with a member frozen (SIGSTOPped), contenders whose lease grant or keepalive stream went to " +
			"its connection stall until that connection breaks (19-24s with clientv3's default options, 6-8s with " +
			"DialKeepAliveTime and DialKeepAliveTimeout of 1s); waiters now re-check their predecessor every third " +
			"of the TTL, which removed the stall of the watch itself, but sessions still have to be granted and kept " +
			"alive away from the frozen member"}
	findingEtcdReleaseDuringElection = finding{"etcd-release-during-election",
		"etcdlock: a release caught by a leader kill now retries its conditional delete (a second per attempt) " +
			"and a given-up session retries its revocation until etcd answers, which brought most leader kills " +
			"to 1-2.6s without a grant; one kill in six still went 4.5s, against max(TTL, election)+1s = 3s"}
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
