package scheduler_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/scheduler"
)

// stoppableRedis runs a redis-server of the test's own, which the test may
// SIGSTOP without disturbing anyone else's, and returns its address and
// process.
func stoppableRedis(t *testing.T) (string, *exec.Cmd) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		drivertest.Unreachable(t, "redis-server binary", "$PATH", err)
	}
	for range 5 { // a free port can be taken by someone else before the server binds it
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--daemonize", "no", "--loglevel", "warning", "--dir", t.TempDir())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			<-exited
		})
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			select {
			case <-exited: // the port was taken
			default:
				if c.Ping(context.Background()).Err() != nil {
					continue
				}
				c.Close()
				return addr, cmd
			}
			break
		}
		c.Close()
	}
	t.Fatal("could not start a redis-server on a free port")
	return "", nil
}

// Stop holds its bound while the slot store hangs under a client that
// ignores contexts: go-redis with its default options waits out its 3 s
// read timeout, and retries, whatever the context says, so that Stop
// waited 20 s for a slot claim and its give-backs. The runs stop waiting
// for their store calls when Stop comes, and Stop waits for the calls left
// behind only within the Guard's release timeout.
func TestStopIsBoundedWhileTheStoreHangs(t *testing.T) {
	t.Parallel()
	addr, server := stoppableRedis(t)
	c := goredis.NewClient(&goredis.Options{Addr: addr}) // defaults, as a user writes them
	t.Cleanup(func() { c.Close() })
	l, err := redislock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	store, err := redislock.NewStore(c)
	if err != nil {
		t.Fatal(err)
	}
	const release = time.Second
	g := newGuard(t, l, guard.WithTTL(3*time.Second), guard.WithReleaseTimeout(release))
	var j journal
	s := newScheduler(t, g, scheduler.WithSlotStore(store), scheduler.WithRunObserver(j.observe))
	if err := s.Add("@every 1s", uniqueName("hung"), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	s.Start()
	j.first(t, scheduler.Ran)
	if err := server.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Past the next slot: its claim is on its way to the hung server.
	time.Sleep(1500 * time.Millisecond)
	began := time.Now()
	err = s.Stop(context.Background())
	took := time.Since(began)
	t.Logf("Stop with the store hung: %v, %v", took.Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("Stop: %v", err)
	}
	// The release timeout for the calls left behind, and a second for the
	// runs to see Stop and for a loaded machine.
	if took > release+time.Second {
		t.Errorf("Stop took %v with the store hung, want at most %v", took.Round(time.Millisecond), release+time.Second)
	}
}
