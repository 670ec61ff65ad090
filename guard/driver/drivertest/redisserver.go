package drivertest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
)

// RedisServer is a redis-server process of a test's own, on a loopback
// port of its own, for the faults a test must never inflict on the shared
// test servers: killing it, freezing it (SIGSTOP) so that it accepts
// connections and answers nothing, restarting it empty. It keeps no data
// on disk: what it held is lost when it dies, as on a server without
// persistence.
type RedisServer struct {
	owner testing.TB // the test whose end stops every process started for it
	bin   string
	args  []string // beyond those that set the port, the directory and no persistence
	addr  string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
}

// redisPatience bounds how long a redis-server may take to answer its
// first PING: long enough for a loaded machine, short enough that a server
// that will never answer fails the test rather than its timeout.
const redisPatience = 15 * time.Second

// StartRedis starts a redis-server on a free loopback port, with args
// (such as "--replicaof", host, port) after its own, and stops it when t
// ends. A missing redis-server binary skips t, or fails it when
// WARDEN_REQUIRE_SERVERS=1, as an unreachable shared server does.
func StartRedis(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Unreachable(t, "redis-server binary", "$PATH", err)
		return nil
	}
	s := &RedisServer{owner: t, bin: bin, args: args}
	// A free port can be taken by another process before the server binds
	// it; the server then exits, and another port is tried.
	for attempt := 1; ; attempt++ {
		s.addr = ClosedAddr(t)
		err := s.start()
		if err == nil {
			return s
		}
		if !errors.Is(err, errExited) || attempt == 5 {
			t.Fatal(err)
		}
	}
}

// errExited is start's error when the process exited before it answered.
var errExited = errors.New("redis-server exited at start")

// Addr is the server's host:port, the same across restarts.
func (s *RedisServer) Addr() string { return s.addr }

// start runs a new process on s.addr, in a new directory so that it finds
// no data of an earlier one (a replica writes what it receives to its
// directory, and loads it at start), and waits until it answers PING. The
// process is killed when the owner test ends.
func (s *RedisServer) start() error {
	host, port, _ := net.SplitHostPort(s.addr)
	args := append([]string{"--port", port, "--bind", host,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
		"--dir", s.owner.TempDir()}, s.args...)
	cmd := exec.Command(s.bin, args...)
	// What the server logs, read once it has exited, for the error.
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	// Cleanups run last registered first: this one, registered after
	// TempDir's, ends the process before its directory is removed. SIGKILL
	// ends a frozen process too.
	s.owner.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(redisPatience)
	for !answersPing(s.addr) {
		select {
		case <-exited:
			return fmt.Errorf("%w on %s (%v): %s", errExited, s.addr, cmd.ProcessState, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer PING within %v", s.addr, redisPatience)
		}
	}
	return nil
}

// answersPing reports whether a Redis server at addr answers PING with
// PONG, as it does once it is ready (not while it is still loading).
func answersPing(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "+PONG\r\n"
}

// Kill ends the server with SIGKILL, as a crash would, and waits for it to
// be gone: its port refuses connections and its data is lost. It fails t
// if the server had already exited of itself.
func (s *RedisServer) Kill(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill redis-server on %s: %v", s.addr, err)
	}
	<-s.exited
}

// Signal sends sig to the server: SIGSTOP freezes it as a hung server (its
// kernel still accepts connections, nothing answers), SIGCONT thaws it.
func (s *RedisServer) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to redis-server on %s: %v", sig, s.addr, err)
	}
}

// Restart kills the server and starts it again on the same port with the
// same arguments and no data: as after a crash without persistence.
func (s *RedisServer) Restart(t testing.TB) {
	t.Helper()
	s.Kill(t)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}
