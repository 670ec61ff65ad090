//go:build faults

package faults

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// Ports of the servers this suite starts, stops and restarts itself: 17xxx,
// below the ephemeral range, and away from the shared servers of
// scripts/services.sh (16379-16384, 12379, 12181, 15432, 13306, 18500-18502),
// which are never stopped. Consul's is portConsul.
const (
	portRedis       = 17379 // no persistence
	portRedisAOF    = 17380 // appendonly, appendfsync always
	portRedlockBase = 17381 // 17381-17385, appendonly, appendfsync always
	portEtcd        = 17479 // and 17480 for peers
	portZK          = 17181
	portPostgres    = 17432
)

// server is a server process of the suite's own. Stopping it and starting it
// again keeps its data directory, as a restart would.
type server struct {
	name  string
	addr  string
	argv  []string
	dir   string
	cred  *syscall.Credential // run as this user (postgres refuses root)
	ready func() bool
	stop  syscall.Signal // the crash-like stop: SIGKILL, or SIGQUIT for postgres

	cmd    *exec.Cmd
	exited chan struct{}
	logf   *os.File
}

// portFree reports whether nothing listens on port, so that a leftover
// server from another run is reported rather than silently used.
func portFree(port int) error {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("port %d is taken (a server left over by an earlier run?): %w", port, err)
	}
	return ln.Close()
}

// start runs the server and waits until it answers.
func (s *server) start(within time.Duration) error {
	if s.logf == nil {
		f, err := os.OpenFile(filepath.Join(s.dir, s.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		s.logf = f
	}
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = s.logf, s.logf
	// Its own process group: a ^C to the test must not reach it before the
	// cleanup does, and the cleanup can then signal the whole group. Killed
	// with the test process, so that a test that times out leaves no
	// server on the suite's ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(within)
	for !s.ready() {
		select {
		case <-exited:
			return fmt.Errorf("%s exited during startup: %s\n%s", s.name, cmd.ProcessState, s.tail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering on %s after %v\n%s", s.name, s.addr, within, s.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// crash stops the server as a crash would, and waits until it is gone.
func (s *server) crash() error {
	if s.cmd == nil {
		return nil
	}
	sig := s.stop
	if sig == 0 {
		sig = syscall.SIGKILL
	}
	s.cmd.Process.Signal(syscall.SIGCONT)
	s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	// Postgres children outlive an immediate shutdown by a moment; the port
	// must be free before the next start.
	deadline := time.Now().Add(30 * time.Second)
	for portFree(portOf(s.addr)) != nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	s.cmd = nil
	return nil
}

func (s *server) close() {
	if s.cmd != nil {
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
		s.cmd = nil
	}
	if s.logf != nil {
		s.logf.Close()
	}
}

func (s *server) tail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, s.name+".log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// ownServer starts a server of the suite's own, stopped at t's end. A port
// already in use fails the test: that server is someone else's.
func ownServer(t *testing.T, s *server, within time.Duration) *server {
	t.Helper()
	if err := portFree(portOf(s.addr)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	if err := s.start(within); err != nil {
		t.Fatal(err)
	}
	return s
}

// scratchDir is a directory that the postgres user can use too.
func scratchDir(t *testing.T, name string) string {
	t.Helper()
	d, err := os.MkdirTemp("", "warden-faults-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o755)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func redisServer(t *testing.T, port int, aof bool) *server {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	dir := scratchDir(t, "redis-"+strconv.Itoa(port))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	argv := []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--daemonize", "no", "--dir", dir, "--logfile", "", "--loglevel", "warning"}
	if aof {
		// What the RedLock docs ask for: every write on disk before it is
		// acknowledged, so a crashed node forgets neither votes nor fences.
		argv = append(argv, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		argv = append(argv, "--appendonly", "no")
	}
	return ownServer(t, &server{name: "redis-" + strconv.Itoa(port), addr: addr, argv: argv, dir: dir,
		ready: func() bool { return redisPing(addr) }}, 30*time.Second)
}

func redisPing(addr string) bool {
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Ping(ctx).Err() == nil
}

// builtServer is the etcd or consul binary that scripts/services.sh builds
// once into its cache directory (WARDEN_ETCD_BIN or WARDEN_CONSUL_BIN name
// another), built by it now if it is not there yet: the suite runs the
// servers the shared ones are, and knows neither their versions nor where
// they are built.
func builtServer(t *testing.T, name string) string {
	t.Helper()
	var stderr strings.Builder
	cmd := exec.Command("bash", filepath.Join("..", "..", "scripts", "services.sh"), "bin", name)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/services.sh bin %s: %v\n%s", name, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

func etcdServer(t *testing.T) *server {
	bin := builtServer(t, "etcd")
	if err := portFree(portEtcd + 1); err != nil {
		t.Fatal(err)
	}
	dir := scratchDir(t, "etcd")
	client := fmt.Sprintf("http://127.0.0.1:%d", portEtcd)
	peer := fmt.Sprintf("http://127.0.0.1:%d", portEtcd+1)
	argv := []string{bin, "--name", "faults", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "faults=" + peer, "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"}
	return ownServer(t, &server{name: "etcd", addr: fmt.Sprintf("127.0.0.1:%d", portEtcd), argv: argv, dir: dir,
		ready: func() bool { return etcdHealthy(client) }}, 60*time.Second)
}

func etcdHealthy(client string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(client + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), `"health":"true"`)
}

// zkServer launches ZooKeeper as scripts/services.sh does: Debian's jars,
// a 200 ms tick (sessions expire at most a tick after their timeout), and a
// minimum session of a second.
func zkServer(t *testing.T) *server {
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("java: %v", err)
	}
	dir := scratchDir(t, "zk")
	conf := filepath.Join(dir, "conf")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("tickTime=200\nminSessionTimeout=1000\nmaxSessionTimeout=60000\ndataDir=%s\n"+
		"clientPort=%d\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n"+
		"4lw.commands.whitelist=*\nforceSync=no\n", filepath.Join(dir, "data"), portZK)
	log4j := "log4j.rootLogger=WARN, CONSOLE\nlog4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n" +
		"log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n" +
		"log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n\n"
	if err := os.WriteFile(filepath.Join(conf, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "log4j.properties"), []byte(log4j), 0o644); err != nil {
		t.Fatal(err)
	}
	cp := conf + ":/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
	argv := []string{java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dlog4j.configuration=file:" + filepath.Join(conf, "log4j.properties"), "-Dzookeeper.jmx.log4j.disable=true",
		"-cp", cp, "org.apache.zookeeper.server.ZooKeeperServerMain", filepath.Join(conf, "zoo.cfg")}
	addr := fmt.Sprintf("127.0.0.1:%d", portZK)
	return ownServer(t, &server{name: "zookeeper", addr: addr, argv: argv, dir: dir,
		ready: func() bool { return zkServing(addr) }}, 90*time.Second)
}

// zkServing: "imok" comes while the server still turns sessions away, so
// this asks for its mode.
func zkServing(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return false
	}
	b, _ := io.ReadAll(c)
	return strings.Contains(string(b), "Mode: standalone")
}

// postgresServer initialises a cluster in a scratch directory and runs the
// postmaster itself, so that a crash is one signal: SIGQUIT, the immediate
// shutdown, after which the next start runs crash recovery.
//
// syncCommit false runs it with synchronous_commit=off, as
// scripts/services.sh does for speed: a crash then loses the transactions
// committed in the last few hundred milliseconds. fsync=off costs nothing
// here, since a crashed process leaves what it wrote in the page cache.
func postgresServer(t *testing.T, syncCommit bool) (*server, string) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		t.Fatal("no /usr/lib/postgresql/*/bin/postgres")
	}
	sort.Strings(bins)
	bindir := filepath.Dir(bins[len(bins)-1])
	dir := scratchDir(t, "postgres")
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, and no postgres user to run postgres as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		os.Chown(dir, uid, gid)
	}
	data := filepath.Join(dir, "data")
	run := filepath.Join(dir, "run")
	initdb := exec.Command(filepath.Join(bindir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	mk := exec.Command("mkdir", "-p", run)
	mk.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("mkdir %s: %v\n%s", run, err, out)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", portPostgres)
	dsn := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=2", addr)
	argv := []string{filepath.Join(bindir, "postgres"), "-D", data,
		"-c", "listen_addresses=127.0.0.1", "-c", "port=" + strconv.Itoa(portPostgres),
		"-c", "unix_socket_directories=" + run, "-c", "max_connections=100",
		"-c", "fsync=off", "-c", "full_page_writes=off"}
	if !syncCommit {
		argv = append(argv, "-c", "synchronous_commit=off")
	}
	s := ownServer(t, &server{name: "postgres", addr: addr, argv: argv, dir: dir, cred: cred, stop: syscall.SIGQUIT,
		ready: func() bool { return postgresReady(dsn) }}, 60*time.Second)
	return s, dsn
}

func postgresReady(dsn string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false
	}
	defer c.Close(ctx)
	return c.Ping(ctx) == nil
}
