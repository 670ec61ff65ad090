//go:build clusters

package clusters

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The defaults are what scripts/clusters.sh starts, so that the suite runs
// after `scripts/clusters.sh up` without evaluating its env output.
var topologyDefaults = map[string]string{
	"WARDEN_CLUSTER_ETCD":  "127.0.0.1:17121,127.0.0.1:17122,127.0.0.1:17123",
	"WARDEN_CLUSTER_ZK":    "127.0.0.1:17141,127.0.0.1:17142,127.0.0.1:17143",
	"WARDEN_CLUSTER_REDIS": "127.0.0.1:17101,127.0.0.1:17102,127.0.0.1:17103,127.0.0.1:17104,127.0.0.1:17105,127.0.0.1:17106",
	// The servers, then the client agent the workload talks to.
	"WARDEN_CLUSTER_CONSUL":        "127.0.0.1:17171,127.0.0.1:17172,127.0.0.1:17173",
	"WARDEN_CLUSTER_CONSUL_CLIENT": "127.0.0.1:17170",
	"WARDEN_CLUSTERS_DIR":          "/tmp/warden-clusters",
}

func setting(name string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return topologyDefaults[name]
}

func addrs(name string) []string { return strings.Split(setting(name), ",") }

// requireUp skips the test when no node of the cluster answers, as the
// repository's other server tests do, unless WARDEN_REQUIRE_SERVERS=1 asks
// for a failure instead (make test-clusters sets it, after starting them).
func requireUp(t *testing.T, variable string) {
	t.Helper()
	for _, addr := range addrs(variable) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
	}
	msg := fmt.Sprintf("nothing answers at %s=%s: run scripts/clusters.sh up", variable, setting(variable))
	if os.Getenv("WARDEN_REQUIRE_SERVERS") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// node is one server process that scripts/clusters.sh started: the tests
// signal it through its pid file, and start it again through the script,
// so that it outlives the test like the others.
type node struct {
	name string // the script's name for it, <kind>-<client port>
	addr string
	comm string // the process's name, so that a reused pid is never signalled
}

func nodeAt(kind, addr, comm string) node {
	_, port, _ := net.SplitHostPort(addr)
	return node{name: kind + "-" + port, addr: addr, comm: comm}
}

func (n node) String() string { return n.name }

func (n node) pid() (int, error) {
	b, err := os.ReadFile(filepath.Join(setting("WARDEN_CLUSTERS_DIR"), n.name, "pid"))
	if err != nil {
		return 0, fmt.Errorf("%s: %w (was scripts/clusters.sh up run?)", n, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: pid file: %w", n, err)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != n.comm {
		return 0, fmt.Errorf("%s: pid %d is not a running %s", n, pid, n.comm)
	}
	return pid, nil
}

func (n node) signal(sig syscall.Signal) error {
	pid, err := n.pid()
	if err != nil {
		return err
	}
	return syscall.Kill(pid, sig)
}

// kill SIGKILLs the node and waits until it no longer accepts connections,
// which is when its clients see it gone.
func (n node) kill(t *testing.T) time.Time {
	t.Helper()
	if err := n.signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s: %v", n, err)
	}
	at := time.Now()
	waitFor(t, 10*time.Second, "killed "+n.name+" to stop listening", func() bool {
		c, err := net.DialTimeout("tcp", n.addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return false
		}
		return true
	})
	return at
}

// start brings the node back with the script, which waits until it answers.
func (n node) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", scriptPath(t), "start", n.name)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/clusters.sh start %s: %v\n%s", n, err, out.String())
	}
	t.Logf("%s", strings.TrimSpace(out.String()))
}

func scriptPath(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "scripts", "clusters.sh"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// faultGuard continues nodes a test stopped and starts nodes it killed, if
// the test ends early, so that the next scenario finds whole clusters.
type faultGuard struct {
	t       *testing.T
	stopped map[string]node
	killed  map[string]node
}

func newFaultGuard(t *testing.T) *faultGuard {
	f := &faultGuard{t: t, stopped: map[string]node{}, killed: map[string]node{}}
	t.Cleanup(func() {
		for _, n := range f.stopped {
			if err := n.signal(syscall.SIGCONT); err != nil {
				t.Logf("cleanup: SIGCONT %s: %v", n, err)
			}
		}
		for _, n := range f.killed {
			t.Logf("cleanup: starting %s again", n)
			n.start(t)
		}
	})
	return f
}

func (f *faultGuard) kill(n node) time.Time {
	f.killed[n.name] = n
	return n.kill(f.t)
}

func (f *faultGuard) start(n node) {
	n.start(f.t)
	delete(f.killed, n.name)
}

func (f *faultGuard) stop(n node) time.Time {
	f.t.Helper()
	if err := n.signal(syscall.SIGSTOP); err != nil {
		f.t.Fatalf("SIGSTOP %s: %v", n, err)
	}
	f.stopped[n.name] = n
	return time.Now()
}

func (f *faultGuard) cont(n node) {
	f.t.Helper()
	if err := n.signal(syscall.SIGCONT); err != nil {
		f.t.Fatalf("SIGCONT %s: %v", n, err)
	}
	delete(f.stopped, n.name)
}

// waitFor polls cond until it holds, failing the test at the deadline.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	if at, err := poll(within, cond); err == nil {
		return at
	}
	t.Fatalf("timed out after %v waiting for %s", within, what)
	return time.Time{}
}

var errTimeout = errors.New("timed out")

// poll returns when cond first held.
func poll(within time.Duration, cond func() bool) (time.Time, error) {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, errTimeout
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// fourLetter sends a ZooKeeper four-letter word and returns the answer.
func fourLetter(addr, word string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(word)); err != nil {
		return "", err
	}
	var b bytes.Buffer
	_, err = b.ReadFrom(c)
	return b.String(), err
}

// zkMode is "leader", "follower", or "" for a server not serving.
func zkMode(addr string) string {
	out, err := fourLetter(addr, "srvr")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(out, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m)
		}
	}
	return ""
}
