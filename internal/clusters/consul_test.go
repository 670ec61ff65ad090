//go:build clusters

package clusters

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/backends/consullock"
)

// consulTTL is the sessions' TTL: the shortest Consul accepts.
const consulTTL = consullock.MinTTL

// consulAdmin asks each Consul server on its own who leads, as etcdAdmin
// does, and reads the datacenter's KV through the client agent.
type consulAdmin struct {
	t       *testing.T
	servers []string // HTTP addresses
	clients map[string]*api.Client
	agent   *api.Client
}

// newConsulAdmin makes one client per agent, each reusing its connections:
// Consul answers 429 to an address with more than 200 connections open
// (http_max_conns_per_client), which a client per request soon reaches.
func newConsulAdmin(t *testing.T) *consulAdmin {
	t.Helper()
	a := &consulAdmin{t: t, servers: addrs("WARDEN_CLUSTER_CONSUL"), clients: map[string]*api.Client{}}
	for _, s := range a.servers {
		c, err := consulClient(s)
		if err != nil {
			t.Fatal(err)
		}
		a.clients[s] = c
	}
	c, err := consulClient(setting("WARDEN_CLUSTER_CONSUL_CLIENT"))
	if err != nil {
		t.Fatal(err)
	}
	a.agent = c
	return a
}

// consulClient is an API client of the agent at addr with the library's
// default options.
func consulClient(addr string) (*api.Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address = addr
	return api.NewClient(cfg)
}

// leaderOf is the server RPC address that the server at addr names as its
// leader, "" for none.
func (a *consulAdmin) leaderOf(addr string) string {
	c := a.clients[addr]
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var leader string
	if _, err := c.Raw().Query("/v1/status/leader", &leader, (&api.QueryOptions{}).WithContext(ctx)); err != nil {
		return ""
	}
	return leader
}

// leader returns the HTTP address of the server that every server among
// servers names as leader, if they agree on one other than not. A server's
// RPC port is its HTTP port + 3 (scripts/clusters.sh).
func (a *consulAdmin) leader(servers []string, not string) (string, bool) {
	agreed := ""
	for _, s := range servers {
		l := a.leaderOf(s)
		if l == "" || (agreed != "" && l != agreed) {
			return "", false
		}
		agreed = l
	}
	host, port, err := net.SplitHostPort(agreed)
	if err != nil {
		return "", false
	}
	var rpc int
	fmt.Sscan(port, &rpc)
	httpAddr := net.JoinHostPort(host, fmt.Sprint(rpc-3))
	if httpAddr == not {
		return "", false
	}
	for _, s := range a.servers {
		if s == httpAddr {
			return s, true
		}
	}
	return "", false
}

func (a *consulAdmin) waitLeader(servers []string, not string, within time.Duration) (string, time.Time) {
	a.t.Helper()
	var leader string
	at := waitFor(a.t, within, fmt.Sprintf("a Consul leader agreed on by %v", servers), func() bool {
		var ok bool
		leader, ok = a.leader(servers, not)
		return ok
	})
	return leader, at
}

// keys lists the datacenter's keys under prefix, with their sessions.
func (a *consulAdmin) keys(prefix string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pairs, _, err := a.agent.KV().List(prefix, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pairs {
		out = append(out, fmt.Sprintf("%s (session %s, create index %d)", p.Key, p.Session, p.CreateIndex))
	}
	return out, nil
}

// startConsul starts the workload on the Consul datacenter: every
// contender talks to the client agent, as an application talks to its
// node's agent, through an API client and a Locker with their libraries'
// default options. The servers are what the faults hit; the agent, which
// forwards to whichever server answers, is not.
func startConsul(t *testing.T, name string) (*consulAdmin, *scenario) {
	t.Helper()
	requireUp(t, "WARDEN_CLUSTER_CONSUL")
	requireUp(t, "WARDEN_CLUSTER_CONSUL_CLIENT")
	a := newConsulAdmin(t)
	a.waitLeader(a.servers, "", 60*time.Second)
	s := startScenario(t, name, "orders/close", consulTTL, func(int) (contender, error) {
		c, err := consulClient(setting("WARDEN_CLUSTER_CONSUL_CLIENT"))
		if err != nil {
			return contender{}, err
		}
		l, err := consullock.New(c)
		if err != nil {
			return contender{}, err
		}
		return contender{locker: l, close: l.Close}, nil
	})
	// No holder is ever cut off from its agent, so no lease has to run
	// out for the lock to come back: it must come back within a second of
	// the datacenter electing a leader, and a waiter, woken by its
	// blocking query, must not leave the key free for longer than that.
	s.electionBound = true
	s.judgeFree = true
	dir := url.PathEscape(s.prefix)
	if lk := consullock.LockKey(s.prefix + s.key); !strings.HasPrefix(lk, dir) {
		t.Fatalf("the lock's keys live under %q, not under %q: the leftover check would see nothing", lk, dir)
	}
	s.diagnose = func() string {
		var b strings.Builder
		for _, srv := range a.servers {
			fmt.Fprintf(&b, "\n  server %s leader %q", srv, a.leaderOf(srv))
		}
		keys, err := a.keys(dir)
		fmt.Fprintf(&b, "\n  keys: %v (err %v)", keys, err)
		return b.String()
	}
	return a, s
}

// finishConsul drains the workload and checks that no key of the run is
// left: every key of a lock starts with its escaped name (LockKey), prefix
// included, and is acquired by a session with behaviour delete, so a key
// left is a session left alive. A session given up while no leader could
// destroy it goes within twice its TTL.
func finishConsul(a *consulAdmin, s *scenario) {
	s.t.Helper()
	dir := url.PathEscape(s.prefix)
	s.finish(func() error {
		keys, err := a.keys(dir)
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			return fmt.Errorf("%d Consul keys under %s: %v", len(keys), dir, keys)
		}
		return nil
	}, 2*s.ttl+10*time.Second)
}

// TestConsulLeaderKill kills (SIGKILL) the leader while the lock is held
// and waited for, then starts it again; three times, as etcd's.
func TestConsulLeaderKill(t *testing.T) {
	faults := newFaultGuard(t)
	a, s := startConsul(t, "consul-kill")

	for range 3 {
		leader, _ := a.waitLeader(a.servers, "", 10*time.Second)
		victim := nodeAt("consul", leader, "consul")
		at := faults.kill(victim)
		_, ready := a.waitLeader(without(a.servers, leader), leader, 30*time.Second)
		s.event(event{name: "SIGKILL leader " + victim.name, at: at, ready: ready})
		s.settle(at, ready.Sub(at)+2*time.Second)

		at = time.Now()
		faults.start(victim)
		_, ready = a.waitLeader(a.servers, "", 60*time.Second)
		s.event(event{name: "restart " + victim.name, at: at, ready: ready})
		s.settle(at, time.Second)
	}

	finishConsul(a, s)
}

// TestConsulLeaderFreeze freezes (SIGSTOP) the leader for longer than the
// TTL: the connections to it stay open and get no answer, which a dead
// server's do not, and whatever was in flight to it waits. Until Serf
// declares it failed, some seconds after the election here, the client
// agent may send it requests again, each answered only by the agent's RPC
// timeout (scripts/clusters.sh), which the bound of election + 1 s
// includes.
func TestConsulLeaderFreeze(t *testing.T) {
	faults := newFaultGuard(t)
	a, s := startConsul(t, "consul-freeze")

	leader, _ := a.waitLeader(a.servers, "", 10*time.Second)
	victim := nodeAt("consul", leader, "consul")
	at := faults.stop(victim)
	_, ready := a.waitLeader(without(a.servers, leader), leader, 30*time.Second)
	s.event(event{name: "SIGSTOP leader " + victim.name, at: at, ready: ready})
	s.settle(at, s.ttl+2*time.Second)
	at = time.Now()
	faults.cont(victim)
	_, ready = a.waitLeader(a.servers, "", 30*time.Second)
	s.event(event{name: "SIGCONT " + victim.name, at: at, ready: ready})
	s.settle(at, time.Second)

	finishConsul(a, s)
}
