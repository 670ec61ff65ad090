//go:build faults

package faults

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/consullock"
)

// portConsul is the HTTP port of the suite's own Consul agent; its server
// RPC and Serf LAN ports are the next two, as scripts/services.sh lays out
// the shared agent's (18500-18502).
const portConsul = 17500

// Consul's leases are sessions: it refuses a TTL under consullock.MinTTL
// (10 s), and its leader invalidates a session that is not renewed only
// twice its TTL after the last renewal it received (the server's
// SessionTTLMultiplier), never sooner. A holder counts its lease from the
// send time of its last answered renewal plus the TTL, so it knows it lost
// the lock at least a TTL before the server can grant it to another; but
// after kill -9, SIGSTOP or a partition of a holder, the lock comes back
// only when the server lets the session go: the Consul rows are judged by
// twice the TTL plus grantSlack from the fault, the bound Consul documents
// and keeps, rather than by the TTL, which Consul never promises.
const (
	consulTTL  = consullock.MinTTL
	consulKeep = 2 * consulTTL
)

// consulLeases gives sc Consul's TTL and bound.
func consulLeases(sc scenario) scenario {
	sc.ttl, sc.keep = consulTTL, consulKeep
	return sc
}

// consulServer starts the suite's own Consul agent, a server of one. With
// dev it is a dev agent, which keeps everything in memory: a restart loses
// every key and session, and starts the Raft index, which the tokens are,
// over. Without it the agent keeps its Raft log and snapshots in its data
// directory, as a server in production does, and comes back with them. Raft
// runs at raft_multiplier 1 (Consul's default of 5 is sized for slow
// machines) so that it elects itself within a second or two of a restart.
func consulServer(t *testing.T, dev bool) *server {
	bin := builtServer(t, "consul")
	for _, p := range []int{portConsul + 1, portConsul + 2} {
		if err := portFree(p); err != nil {
			t.Fatal(err)
		}
	}
	dir := scratchDir(t, "consul")
	argv := []string{bin, "agent"}
	if dev {
		argv = append(argv, "-dev")
	} else {
		argv = append(argv, "-server", "-bootstrap-expect", "1", "-data-dir", filepath.Join(dir, "data"))
	}
	argv = append(argv, "-bind", "127.0.0.1", "-client", "127.0.0.1", "-node", "warden-faults",
		"-http-port", strconv.Itoa(portConsul), "-server-port", strconv.Itoa(portConsul+1),
		"-serf-lan-port", strconv.Itoa(portConsul+2), "-serf-wan-port", "-1", "-dns-port", "-1",
		"-grpc-port", "-1", "-grpc-tls-port", "-1", "-https-port", "-1",
		"-hcl", "performance { raft_multiplier = 1 }", "-log-level", "warn")
	addr := fmt.Sprintf("127.0.0.1:%d", portConsul)
	name := "consul"
	if dev {
		name = "consul-dev"
	}
	return ownServer(t, &server{name: name, addr: addr, argv: argv, dir: dir,
		ready: func() bool { return consulLeader(addr) }}, 60*time.Second)
}

// consulLeader reports whether the agent at addr knows a leader: it then
// serves reads and writes.
func consulLeader(addr string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/v1/status/leader")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && strings.HasPrefix(string(b), `"`) && len(strings.Trim(string(b), "\"\n")) > 0
}

func ownConsul(dev bool) func(t *testing.T, r *run) backendSpec {
	return func(t *testing.T, r *run) backendSpec {
		s := consulServer(t, dev)
		r.servers = append(r.servers, s)
		return backendSpec{Kind: "consul", Addrs: []string{s.addr}}
	}
}
