//go:build clusters

package clusters

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/warden-go/warden/backends/etcdlock"
)

// etcdAdmin talks to each member on its own, since the tests must know what
// one particular member thinks (who leads), which a client balancing over
// all of them would hide.
type etcdAdmin struct {
	t       *testing.T
	members []string
	clients map[string]*clientv3.Client
	all     *clientv3.Client
}

func newEtcdAdmin(t *testing.T) *etcdAdmin {
	t.Helper()
	a := &etcdAdmin{t: t, members: addrs("WARDEN_CLUSTER_ETCD"), clients: map[string]*clientv3.Client{}}
	for _, ep := range a.members {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a.clients[ep] = c
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: a.members, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	a.all = c
	return a
}

// status is what member ep reports: its own id and its leader's (0: none).
func (a *etcdAdmin) status(ep string) (self, leader uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := a.clients[ep].Status(ctx, ep)
	if err != nil {
		return 0, 0, err
	}
	return r.Header.MemberId, r.Leader, nil
}

// leader returns the endpoint of the member that every answering member
// among eps names as leader, if they agree on one other than not.
func (a *etcdAdmin) leader(eps []string, not uint64) (string, uint64, bool) {
	ids := map[uint64]string{}
	var leader uint64
	for _, ep := range eps {
		self, l, err := a.status(ep)
		if err != nil || l == 0 || l == not || (leader != 0 && l != leader) {
			return "", 0, false
		}
		ids[self], leader = ep, l
	}
	ep, ok := ids[leader]
	return ep, leader, ok
}

func (a *etcdAdmin) waitLeader(eps []string, not uint64, within time.Duration) (string, uint64, time.Time) {
	a.t.Helper()
	var ep string
	var id uint64
	at := waitFor(a.t, within, fmt.Sprintf("a leader agreed on by %v", eps), func() bool {
		var ok bool
		ep, id, ok = a.leader(eps, not)
		return ok
	})
	return ep, id, at
}

func without(all []string, drop string) []string {
	var out []string
	for _, s := range all {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

// startEtcd starts the workload on the etcd cluster: contenders with
// clientv3's default options (but a dial timeout, as the package's example
// has) over all three endpoints, and etcdlock's defaults.
func startEtcd(t *testing.T, name string, ttl time.Duration) (*etcdAdmin, *scenario) {
	t.Helper()
	requireUp(t, "WARDEN_CLUSTER_ETCD")
	a := newEtcdAdmin(t)
	a.waitLeader(a.members, 0, 60*time.Second)
	s := startScenario(t, name, "orders/close", ttl, func(int) (contender, error) {
		c, err := clientv3.New(clientv3.Config{Endpoints: a.members, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return contender{}, err
		}
		l, err := etcdlock.New(c)
		if err != nil {
			c.Close()
			return contender{}, err
		}
		return contender{locker: l, close: func() error { return errors.Join(l.Close(), c.Close()) }}, nil
	})
	dir := url.PathEscape(s.prefix)
	if kd := etcdlock.KeyDir(s.prefix + s.key); !strings.HasPrefix(kd, dir) {
		t.Fatalf("the lock's keys live under %q, not under %q: the leftover check would see nothing", kd, dir)
	}
	s.diagnose = func() string {
		var b strings.Builder
		for _, ep := range a.members {
			self, leader, err := a.status(ep)
			fmt.Fprintf(&b, "\n  member %s id %x leader %x err %v", ep, self, leader, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := a.all.Get(ctx, dir, clientv3.WithPrefix())
		if err != nil {
			return b.String() + "\n  keys: " + err.Error()
		}
		for _, kv := range r.Kvs {
			left := int64(-2)
			if ttl, err := a.all.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil {
				left = ttl.TTL
			}
			fmt.Fprintf(&b, "\n  key %s create rev %d lease %x (ttl left %ds)", kv.Key, kv.CreateRevision, kv.Lease, left)
		}
		return b.String()
	}
	return a, s
}

// finishEtcd drains the workload and checks that no key of the run outlives
// the sessions' leases: every key of a lock starts with its escaped name
// (KeyDir), prefix included.
func finishEtcd(a *etcdAdmin, s *scenario) {
	s.t.Helper()
	dir := url.PathEscape(s.prefix)
	s.finish(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := a.all.Get(ctx, dir, clientv3.WithPrefix())
		if err != nil {
			return err
		}
		if r.Count > 0 {
			var keys []string
			for _, kv := range r.Kvs {
				keys = append(keys, fmt.Sprintf("%s (lease %x)", kv.Key, kv.Lease))
			}
			return fmt.Errorf("%d etcd keys under %s: %v", r.Count, dir, keys)
		}
		return nil
	}, s.ttl+10*time.Second)
}

// TestEtcdLeaderKill kills (SIGKILL) the leader while the lock is held and
// contended, then starts it again; three times, since what a kill catches
// in flight (a release, a contender's put) varies from one to the next.
func TestEtcdLeaderKill(t *testing.T) {
	const ttl = 2 * time.Second
	faults := newFaultGuard(t)
	a, s := startEtcd(t, "etcd-kill", ttl)

	for range 3 {
		leader, leaderID, _ := a.waitLeader(a.members, 0, 10*time.Second)
		victim := nodeAt("etcd", leader, "etcd")
		at := faults.kill(victim)
		_, _, ready := a.waitLeader(without(a.members, leader), leaderID, 30*time.Second)
		s.event(event{name: "SIGKILL leader " + victim.name, at: at, ready: ready})
		s.settle(at, ttl+time.Second)

		at = time.Now()
		faults.start(victim)
		_, _, ready = a.waitLeader(a.members, 0, 60*time.Second)
		s.event(event{name: "restart " + victim.name, at: at, ready: ready})
		s.settle(at, time.Second)
	}

	finishEtcd(a, s)
}

// TestEtcdMemberFreeze freezes (SIGSTOP) the leader for longer than the
// TTL, then a follower: their clients' connections stay open and get no
// answer, which a dead member's do not.
func TestEtcdMemberFreeze(t *testing.T) {
	const ttl = 2 * time.Second
	faults := newFaultGuard(t)
	a, s := startEtcd(t, "etcd-freeze", ttl)

	// The others elect a new leader after the election timeout.
	leader, leaderID, _ := a.waitLeader(a.members, 0, 10*time.Second)
	victim := nodeAt("etcd", leader, "etcd")
	at := faults.stop(victim)
	_, _, ready := a.waitLeader(without(a.members, leader), leaderID, 30*time.Second)
	s.event(event{name: "SIGSTOP leader " + victim.name, at: at, ready: ready})
	s.settle(at, ttl+2*time.Second)
	at = time.Now()
	faults.cont(victim)
	_, _, ready = a.waitLeader(a.members, 0, 30*time.Second)
	s.event(event{name: "SIGCONT " + victim.name, at: at, ready: ready})
	s.settle(at, time.Second)

	// A frozen follower: no election, only the clients it serves are cut
	// off without knowing it.
	leader, _, _ = a.waitLeader(a.members, 0, 10*time.Second)
	victim = nodeAt("etcd", without(a.members, leader)[0], "etcd")
	at = faults.stop(victim)
	s.event(event{name: "SIGSTOP follower " + victim.name, at: at})
	s.settle(at, ttl+2*time.Second)
	at = time.Now()
	faults.cont(victim)
	_, _, ready = a.waitLeader(a.members, 0, 30*time.Second)
	s.event(event{name: "SIGCONT " + victim.name, at: at, ready: ready})
	s.settle(at, time.Second)

	finishEtcd(a, s)
}
