package zklock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// testSession is the session timeout, hence the lease TTL, of the tests: the
// session the test servers grant (minSessionTimeout is 1s; they expire
// sessions in 200ms ticks) with room for a busy machine.
const testSession = 2 * time.Second

// testRoot keeps the tests' nodes apart from anything else on the server.
const testRoot = "/warden-test/locks"

func servers(t testing.TB) []string {
	t.Helper()
	return strings.Split(drivertest.Addr(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181"), ",")
}

type discard struct{}

func (discard) Printf(string, ...any) {}

// dial returns a Locker closed at the end of the test. Connection errors are
// expected in the fault tests, so the client library's log is dropped.
func dial(t testing.TB, addrs []string, opts ...Option) *Locker {
	t.Helper()
	l, err := New(addrs, append([]Option{WithSessionTimeout(testSession), WithRoot(testRoot), WithLogger(discard{})}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// waiters counts the contenders queued on key's lock that do not hold it.
func waiters(t testing.TB, l *Locker, key string) int {
	t.Helper()
	names, _, err := l.conn.Children(l.lockPath(key))
	if errors.Is(err, zk.ErrNoNode) {
		return 0
	}
	if err != nil {
		t.Fatalf("Children: %v", err)
	}
	q := queue(nil, names)
	n := 0
	for i := range q {
		if holds, _, _ := decide(q, i, 1); !holds {
			n++
		}
	}
	return n
}

var keySeq atomic.Int64

// testKey returns a key no other test or earlier run has used.
func testKey(t testing.TB) string {
	return fmt.Sprintf("%s/%d-%d", t.Name(), time.Now().UnixNano(), keySeq.Add(1))
}

// eventually polls cond until it holds or a generous deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// children lists the nodes queued on key's lock.
func children(t testing.TB, l *Locker, key string) []string {
	t.Helper()
	names, _, err := l.conn.Children(l.lockPath(key))
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("Children: %v", err)
	}
	return names
}

// zkServer is a ZooKeeper server of the test's own, for faults that must not
// touch the shared one.
type zkServer struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
	args   []string      // of the JVM
	data   string        // the data directory
	log    *os.File
}

// startServer starts a standalone ZooKeeper on a free port with its data in
// a temporary directory, and waits until it answers. A server that cannot be
// started skips the test, or fails it when WARDEN_REQUIRE_SERVERS=1.
// properties are -D flags for its JVM.
func startServer(t *testing.T, properties ...string) *zkServer {
	t.Helper()
	return startServerUpTo(t, time.Minute, properties...)
}

// startServerUpTo is startServer for a server that grants sessions of at
// most maxSession (its maxSessionTimeout).
func startServerUpTo(t *testing.T, maxSession time.Duration, properties ...string) *zkServer {
	t.Helper()
	java, err := exec.LookPath("java")
	if err != nil {
		drivertest.Unreachable(t, "java", "PATH", err)
		return nil
	}
	dir := t.TempDir()
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	// A port found free can be taken by another process before the JVM
	// binds it, and the JVM then exits: it is started again on another.
	for attempt := 1; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		cfg := filepath.Join(dir, "zoo.cfg")
		data := filepath.Join(dir, "data")
		conf := fmt.Sprintf("tickTime=200\nminSessionTimeout=1000\nmaxSessionTimeout=%d\ndataDir=%s\n"+
			"clientPort=%d\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=*\n",
			maxSession.Milliseconds(), data, port)
		if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		args := append([]string{java, "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"}, properties...)
		s := &zkServer{addr: fmt.Sprintf("127.0.0.1:%d", port), data: data, log: logf,
			args: append(args, "-cp", "/usr/share/java/*:/etc/zookeeper/conf", "org.apache.zookeeper.server.ZooKeeperServerMain", cfg)}
		err = s.start()
		if err == nil {
			t.Cleanup(s.Kill)
			return s
		}
		if !errors.Is(err, errExited) || attempt == 3 {
			drivertest.Unreachable(t, "own ZooKeeper", s.addr, err)
			return nil
		}
		t.Logf("own ZooKeeper on %s: %v; starting it on another port", s.addr, err)
	}
}

// errExited is the failure of a server whose JVM exited before it served.
var errExited = errors.New("the JVM exited before serving")

// start runs the server's JVM and waits until it serves; the JVM is ended
// when it does not.
func (s *zkServer) start() error {
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// Killed with the test process, should the test time out: a JVM left
	// behind keeps its port and its memory until someone finds it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Kill ends the last JVM started, whose Wait is this goroutine's.
	exited := make(chan struct{})
	s.cmd, s.exited = cmd, exited
	go func() {
		cmd.Wait()
		close(exited)
	}()
	// A JVM on a loaded machine takes a while; the deadline only bounds a
	// server that will never come up.
	deadline := time.Now().Add(60 * time.Second)
	for !s.ok() {
		select {
		case <-exited:
			log, _ := os.ReadFile(s.log.Name())
			return fmt.Errorf("%w (%v); log:\n%s", errExited, s.cmd.ProcessState, log)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Kill()
			log, _ := os.ReadFile(s.log.Name())
			return fmt.Errorf("not answering after 60s; log:\n%s", log)
		}
	}
	return nil
}

// restart kills the server and starts it again on the same port, with its
// data directory emptied first when wipe is set, as a server that lost its
// disk.
func (s *zkServer) restart(t *testing.T, wipe bool) {
	t.Helper()
	s.Kill()
	if wipe {
		if err := os.RemoveAll(s.data); err != nil {
			t.Fatal(err)
		}
	}
	s.startAgain(t)
}

// startAgain starts the server, killed, again on its port, and waits until
// it serves.
func (s *zkServer) startAgain(t *testing.T) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatalf("own ZooKeeper on %s, started again: %v", s.addr, err)
	}
}

// ok reports whether the server serves clients: "imok" to "ruok" comes too
// early, while it still turns sessions away, so it asks "srvr" for its mode.
// A server that answers so at addr may also be another process's, which
// took the port first: its data directory tells.
func (s *zkServer) ok() bool {
	return strings.Contains(s.answer("srvr"), "Mode: standalone") &&
		strings.Contains(s.answer("conf"), "dataDir="+s.data+string(filepath.Separator))
}

// answer is what the server at addr answers the four-letter command word,
// empty when it does not.
func (s *zkServer) answer(word string) string {
	c, err := net.DialTimeout("tcp", s.addr, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(word)); err != nil {
		return ""
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

// Kill stops the server with SIGKILL.
func (s *zkServer) Kill() {
	s.cmd.Process.Kill()
	<-s.exited
}

// sessionDone is the Done channel of the session that keeps lease.
func sessionDone(lease driver.Lease) <-chan struct{} {
	return lease.(driver.SessionLease).Session().Done()
}

// acquireLater starts a waiting Acquire of key on l and returns where its
// lease will come, nil if it failed (the test is marked failed then).
func acquireLater(ctx context.Context, t testing.TB, l *Locker, key string) <-chan driver.Lease {
	got := make(chan driver.Lease, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession, Wait: true})
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	return got
}

// fourLetter sends a four-letter command (srvr, wchp, ...) to the ZooKeeper
// server at addr and returns its answer.
func fourLetter(t testing.TB, addr, word string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(word)); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
