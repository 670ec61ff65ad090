//go:build clusters

package clusters

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/backends/zklock"
)

// quietZK drops the ZooKeeper client's connection messages, hundreds of which
// a leader kill produces.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

// zkLeader returns the server among servers that says it leads while every
// other one says it follows.
func zkLeader(servers []string) (string, bool) {
	leader := ""
	for _, s := range servers {
		switch zkMode(s) {
		case "leader":
			if leader != "" {
				return "", false
			}
			leader = s
		case "follower":
		default:
			return "", false
		}
	}
	return leader, leader != ""
}

func waitZKLeader(t *testing.T, servers []string, within time.Duration) (string, time.Time) {
	t.Helper()
	var leader string
	at := waitFor(t, within, fmt.Sprintf("a ZooKeeper leader with followers among %v", servers), func() bool {
		var ok bool
		leader, ok = zkLeader(servers)
		return ok
	})
	return leader, at
}

// zkRun is the workload on the ensemble, with an admin connection of its
// own to look at the nodes.
type zkRun struct {
	*scenario
	servers []string
	root    string
	admin   *zk.Conn
}

// startZK starts the workload: one Locker (one session) per contender,
// with the session timeout as the lease TTL.
func startZK(t *testing.T, name string, ttl time.Duration) *zkRun {
	t.Helper()
	requireUp(t, "WARDEN_CLUSTER_ZK")
	r := &zkRun{servers: addrs("WARDEN_CLUSTER_ZK"), root: "/warden-clusters/" + runID + "-" + name}
	waitZKLeader(t, r.servers, 60*time.Second)
	admin, _, err := zk.Connect(r.servers, 10*time.Second, zk.WithLogger(quietZK{}), zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	r.admin = admin
	r.scenario = startScenario(t, name, "orders/close", ttl, func(int) (contender, error) {
		l, err := zklock.New(r.servers, zklock.WithSessionTimeout(ttl), zklock.WithRoot(r.root), zklock.WithLogger(quietZK{}))
		if err != nil {
			return contender{}, err
		}
		return contender{locker: l, close: l.Close}, nil
	})
	r.diagnose = func() string {
		var b strings.Builder
		for _, sv := range r.servers {
			fmt.Fprintf(&b, "\n  %s: %q", sv, zkMode(sv))
			// The clients connected to it, with their sessions: a
			// client missing from every live server is stuck elsewhere.
			cons, _ := fourLetter(sv, "cons")
			for line := range strings.SplitSeq(cons, "\n") {
				if strings.Contains(line, "sid=") {
					fmt.Fprintf(&b, "\n    %s", strings.TrimSpace(line))
				}
			}
		}
		nodes, err := r.tree()
		fmt.Fprintf(&b, "\n  nodes under %s: %v (err %v)", r.root, nodes, err)
		return b.String()
	}
	return r
}

// tree lists every node under the run's root, with the session owning each
// ephemeral one.
func (r *zkRun) tree() ([]string, error) {
	var nodes []string
	var walk func(p string) error
	walk = func(p string) error {
		kids, _, err := r.admin.Children(p)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, k := range kids {
			c := path.Join(p, k)
			if _, st, err := r.admin.Get(c); err == nil && st.EphemeralOwner != 0 {
				nodes = append(nodes, fmt.Sprintf("%s (session %x)", c, st.EphemeralOwner))
			} else {
				nodes = append(nodes, c)
			}
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	return nodes, walk(r.root)
}

// finish drains the workload and checks that the ensemble holds nothing of
// it: ephemeral nodes go with their sessions, and the lock's container node
// is reaped by the leader once empty (every second, as scripts/clusters.sh
// configures it).
func (r *zkRun) finish() {
	r.t.Helper()
	r.scenario.finish(func() error {
		nodes, err := r.tree()
		if err != nil {
			return err
		}
		if len(nodes) > 0 {
			return fmt.Errorf("znodes under %s: %v", r.root, nodes)
		}
		return nil
	}, r.ttl+15*time.Second)
	if err := r.admin.Delete(r.root, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		r.t.Logf("deleting %s: %v", r.root, err)
	}
}

// TestZooKeeperLeaderKill kills (SIGKILL) the leader while the lock is held
// and contended, then starts it again; twice, so that the second kill hits
// a leader elected under load.
func TestZooKeeperLeaderKill(t *testing.T) {
	const ttl = 3 * time.Second // the session timeout: the lease TTL
	faults := newFaultGuard(t)
	r := startZK(t, "zookeeper-kill", ttl)

	for range 2 {
		leader, _ := waitZKLeader(t, r.servers, 10*time.Second)
		victim := nodeAt("zookeeper", leader, "java")
		at := faults.kill(victim)
		_, ready := waitZKLeader(t, without(r.servers, leader), 60*time.Second)
		r.event(event{name: "SIGKILL leader " + victim.name, at: at, ready: ready})
		r.settle(at, ttl+time.Second)

		at = time.Now()
		faults.start(victim)
		_, ready = waitZKLeader(t, r.servers, 60*time.Second)
		r.event(event{name: "restart " + victim.name, at: at, ready: ready})
		r.settle(at, time.Second)
	}

	r.finish()
}

// TestZooKeeperLeaderFreeze freezes (SIGSTOP) the leader, as a long GC
// pause would, for longer than the session timeout: the followers elect
// another once they have not heard from it for syncLimit (3s here).
func TestZooKeeperLeaderFreeze(t *testing.T) {
	const ttl = 3 * time.Second
	faults := newFaultGuard(t)
	r := startZK(t, "zookeeper-freeze", ttl)

	leader, _ := waitZKLeader(t, r.servers, 10*time.Second)
	victim := nodeAt("zookeeper", leader, "java")
	at := faults.stop(victim)
	_, ready := waitZKLeader(t, without(r.servers, leader), 60*time.Second)
	r.event(event{name: "SIGSTOP leader " + victim.name, at: at, ready: ready})
	r.settle(at, ttl+2*time.Second)
	at = time.Now()
	faults.cont(victim)
	_, ready = waitZKLeader(t, r.servers, 60*time.Second)
	r.event(event{name: "SIGCONT " + victim.name, at: at, ready: ready})
	r.settle(at, time.Second)

	r.finish()
}
