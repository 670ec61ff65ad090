package redlock

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// server is a redis-server process of the test's own, for faults (stopping,
// freezing) that must never touch the shared test servers.
type server struct {
	cmd  *exec.Cmd
	addr string
}

// startServers starts n private redis-server processes, stopped at cleanup.
// A missing binary skips the test, or fails it when WARDEN_REQUIRE_SERVERS=1.
func startServers(t *testing.T, n int) []*server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		drivertest.Unreachable(t, "redis-server binary", "$PATH", err)
		return nil
	}
	out := make([]*server, n)
	for i := range out {
		out[i] = startServer(t, bin, 0)
	}
	return out
}

// startServer starts a redis-server on port, or on a free one when port is
// 0.
func startServer(t *testing.T, bin string, port int) *server {
	t.Helper()
	fixed := port
	for range 5 { // a free port can be taken by someone else before we bind it
		if port = fixed; port == 0 {
			port = freePort(t)
		}
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		s := &server{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port)}
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			cmd.Wait()
		})
		go func() { // drain, so the server never blocks on a full pipe
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
			}
		}()
		if s.waitReady(15 * time.Second) {
			return s
		}
		cmd.Process.Kill()
	}
	t.Fatal("could not start redis-server on a free port")
	return nil
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (s *server) waitReady(patience time.Duration) bool {
	c := goredis.NewClient(&goredis.Options{Addr: s.addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(patience)
	for time.Now().Before(deadline) {
		if s.cmd.ProcessState != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// restart starts the server again on its port, with no data: as after a
// crash without persistence.
func (s *server) restart(t *testing.T) {
	t.Helper()
	s.kill(t)
	_, port, _ := net.SplitHostPort(s.addr)
	p, _ := strconv.Atoi(port)
	*s = *startServer(t, s.cmd.Path, p)
}

func (s *server) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	s.cmd.Wait()
}

func (s *server) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}
