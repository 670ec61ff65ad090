package etcdlock

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// privateEtcd starts an etcd member of its own, on free loopback ports
// with its data in t's temporary directory, for tests that change the
// server's configuration (authentication, say) where the shared server
// must stay as it is; extra are more flags. It returns the client
// endpoint, and stops the member at cleanup. It skips when the shared
// server is not running, since the binary is the one built for it
// (WARDEN_ETCD_BIN names another).
func privateEtcd(t *testing.T, extra ...string) string {
	t.Helper()
	endpoints(t)
	bin := os.Getenv("WARDEN_ETCD_BIN")
	if bin == "" {
		out, err := exec.Command("bash", filepath.Join("..", "..", "scripts", "services.sh"), "bin", "etcd").Output()
		if err != nil {
			t.Fatalf("scripts/services.sh bin etcd: %v", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	client, peer := "http://"+closedAddr(t), "http://"+closedAddr(t)
	var log bytes.Buffer
	cmd := exec.Command(bin, append([]string{"--name", "private", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "private=" + peer, "--log-level", "warn"}, extra...)...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	ep := strings.TrimPrefix(client, "http://")
	c := newClient(t, []string{ep})
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, "health")
		cancel()
		if err == nil {
			return ep
		}
		select {
		case <-exited:
			t.Fatalf("private etcd exited: %s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("private etcd not ready: %v\n%s", err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
