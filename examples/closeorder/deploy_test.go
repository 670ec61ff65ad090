package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestOperatorEndpointsOffTheAPI: the debug page, the metrics and the job
// runs answer on the admin listener only, with the debug page's security
// headers; with -admin-addr empty there is no admin listener at all; the
// default admin address is loopback.
func TestOperatorEndpointsOffTheAPI(t *testing.T) {
	bin := buildService(t)
	r := startReplica(t, bin, "admin", "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"), "-lock", "memory")
	if r.admin == "" {
		t.Fatal("no admin address in the banner")
	}
	for _, path := range []string{"/debug/warden", "/metrics", "/jobs/runs"} {
		if code, _ := status(t, "http://"+r.url+path); code != http.StatusNotFound {
			t.Errorf("API %s: %d, want 404", path, code)
		}
		code, h := status(t, "http://"+r.admin+path)
		if code != http.StatusOK {
			t.Errorf("admin %s: %d, want 200", path, code)
		}
		if path == "/debug/warden" && (h.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'")) {
			t.Errorf("the debug page's headers: %v", h)
		}
	}
	if code, _ := status(t, "http://"+r.url+"/healthz"); code != http.StatusOK {
		t.Errorf("API /healthz: %d", code)
	}

	off := startReplica(t, bin, "no-admin", "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"), "-lock", "memory", "-admin-addr", "")
	if off.admin != "" {
		t.Errorf("-admin-addr '': admin listener at %s", off.admin)
	}
	if code, _ := status(t, "http://"+off.url+"/debug/warden"); code != http.StatusNotFound {
		t.Errorf("-admin-addr '': API /debug/warden %d, want 404", code)
	}

	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(cfg.adminAddr)
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Errorf("default -admin-addr %q is not loopback", cfg.adminAddr)
	}
}

// TestHealthNamesTheBackend: with the lock backend gone (its connections go
// through a proxy the test closes), /healthz answers 503 naming redis, and
// nothing of the error: no address, no "connection refused".
func TestHealthNamesTheBackend(t *testing.T) {
	p := drivertest.StartProxy(t, drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379"))
	bin := buildService(t)
	r := startReplica(t, bin, "health", "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"), "-lock", "redis://"+p.Addr())
	if code, _ := status(t, "http://"+r.url+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz with redis up: %d", code)
	}
	p.Cut()
	var body string
	waitUntil(t, "/healthz to fail", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + r.url + "/healthz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	_, port, _ := net.SplitHostPort(p.Addr())
	if !strings.Contains(body, "redis") || strings.Contains(body, port) || strings.Contains(body, "refused") || strings.Contains(body, "dial") {
		t.Fatalf("/healthz: %s; want redis named, and no error text", body)
	}
}

// TestSlowBodyIsCutOff: a client that sends the headers of a POST and part
// of its body, then nothing, is cut off after -read-timeout instead of
// holding a connection and a handler.
func TestSlowBodyIsCutOff(t *testing.T) {
	bin := buildService(t)
	r := startReplica(t, bin, "slow", "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"), "-lock", "memory", "-read-timeout", "1s")
	c, err := net.Dial("tcp", r.url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, "POST /orders HTTP/1.1\r\nHost: x\r\nX-User-ID: u\r\nIdempotency-Key: slow-1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"amount"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = io.Copy(io.Discard, bufio.NewReader(c))
	if took := time.Since(start); err != nil || took > 10*time.Second {
		t.Fatalf("the connection: %v after %v; want it closed by the server within 10s", err, took)
	}
}

func status(t *testing.T, url string) (int, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header
}

// TestBannerHidesPasswords: the start-up banner, the log and the one-line
// error of a backend that cannot be reached show no password, whether it
// is in the user info (with characters that need encoding) or a
// ?password= parameter.
func TestBannerHidesPasswords(t *testing.T) {
	ctx := context.Background()
	addr := drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	user := fmt.Sprintf("closeorder-%d", time.Now().UnixNano())
	const pw = "Ex4mple/p@ss:w%rd"
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pw, "~*", "&*", "+@all").Err(); err != nil {
		if os.Getenv("WARDEN_REQUIRE_SERVERS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	defer admin.Do(ctx, "ACL", "DELUSER", user)
	shows := func(s string) bool {
		return strings.Contains(s, "Ex4mple") || strings.Contains(s, "w%rd") || strings.Contains(s, url.QueryEscape(pw)[8:])
	}

	bin := buildService(t)
	lock := "redis://" + user + ":" + url.QueryEscape(pw) + "@" + addr
	r := startReplica(t, bin, "banner", "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"), "-lock", lock)
	if code, _ := status(t, "http://"+r.url+"/healthz"); code != http.StatusOK || !strings.Contains(r.banner, "redis://xxxxx@") || shows(r.banner) {
		t.Fatalf("healthz %d, banner %q; want the service up on its ACL user, and the banner without the password", code, r.banner)
	}
	if logs, _ := os.ReadFile(r.stderr); shows(string(logs)) {
		t.Fatalf("the log shows the password: %s", logs)
	}

	for _, args := range [][]string{
		{"-lock", "redis://" + user + ":" + url.QueryEscape(pw) + "@127.0.0.1:1"},
		{"-lock", "redis://" + user + ":" + pw + "@" + addr},
		{"-db", "postgres://warden@127.0.0.1:1/warden?sslmode=disable&password=" + url.QueryEscape(pw)},
		{"-db", "postgres://warden:" + pw + "@127.0.0.1:1/warden"},
		{"-lock", "etcd://root:" + url.QueryEscape(pw) + "@127.0.0.1:1"},
	} {
		if args[0] == "-lock" {
			args = append(args, "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"))
		}
		out, err := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-admin-addr", ""}, args...)...).CombinedOutput()
		if err == nil || shows(string(out)) || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
			t.Errorf("closeorder %q: %v, %q; want one line of error without the password", args, err, out)
		}
	}
}
