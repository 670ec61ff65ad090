package backendurl

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestEtcdQuorumLost: a member that has lost its quorum still answers its
// status, but reads and locks wait for a leader that never comes: with two
// of three members down, a Store's open and its health check fail rather
// than pass.
func TestEtcdQuorumLost(t *testing.T) {
	hosts, stop := etcdCluster(t, 3)
	u, err := Parse("etcd://" + strings.Join(hosts, ","))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := NewOpener()
	defer before.Close()
	if _, err := before.Store(ctx, u); err != nil {
		t.Fatalf("Store with every member up: %v", err)
	}
	stop(0)
	stop(1)

	for _, p := range before.Pings() {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.Check(pctx)
		cancel()
		if err == nil {
			t.Errorf("health check %s with 2 of 3 members down: nil, want an error", p.Backend)
		}
	}
	after := NewOpener()
	defer after.Close()
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := after.Store(octx, u); err == nil {
		t.Error("Store opened with 2 of 3 members down")
	}
}

// etcdCluster starts an etcd cluster of n members of its own, on free
// loopback ports with their data in t's temporary directory, and returns
// their client addresses and a function that kills member i. It skips when
// the shared etcd is not running, since the binary is the one built for it.
func etcdCluster(t *testing.T, n int) (hosts []string, stop func(i int)) {
	t.Helper()
	drivertest.Addr(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379")
	out, err := exec.Command("bash", filepath.Join("..", "..", "scripts", "services.sh"), "bin", "etcd").Output()
	if err != nil {
		t.Fatalf("scripts/services.sh bin etcd: %v", err)
	}
	bin := strings.TrimSpace(string(out))
	var peers []string
	for i := range n {
		hosts = append(hosts, freeAddr(t))
		peers = append(peers, fmt.Sprintf("m%d=http://%s", i, freeAddr(t)))
	}
	var cmds []*exec.Cmd
	var exited []chan struct{}
	for i := range n {
		peer := strings.TrimPrefix(peers[i], fmt.Sprintf("m%d=", i))
		client := "http://" + hosts[i]
		cmd := exec.Command(bin, "--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(t.TempDir(), "data"),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(peers, ","), "--log-level", "warn")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-done
		})
		cmds, exited = append(cmds, cmd), append(exited, done)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: hosts, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, "ready")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("private etcd cluster not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return hosts, func(i int) {
		cmds[i].Process.Kill()
		<-exited[i]
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
