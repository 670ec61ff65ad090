package main

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// binDir holds the CLI built once for the tests that run it as an operator
// does; TestMain removes it.
var binDir string

var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "warden-cli-test-")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "warden")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", &buildError{out: string(out), err: err}
	}
	return bin, nil
})

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// warden runs the built CLI, its environment without WARDEN_LOCK.
func warden(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "WARDEN_LOCK=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errOut.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errOut.String()
}

// TestSecretsNeverShown runs the CLI on URLs of every scheme with a
// password written in every way an operator writes one, on servers that
// refuse it and on ports where nothing answers: the password appears
// nowhere in stdout or stderr, in whole or in part, and the error is one
// line.
func TestSecretsNeverShown(t *testing.T) {
	hosts := backendURLs(t)
	redisAddr := strings.TrimPrefix(hosts["redis"], "redis://")
	pg := strings.TrimPrefix(hosts["postgres"], "postgres://warden:warden@")
	etcdAddr := strings.TrimPrefix(hosts["etcd"], "etcd://")
	zkAddr := strings.TrimPrefix(hosts["zk"], "zk://")
	myAddr := "127.0.0.1:13306"
	if _, rest, ok := strings.Cut(hosts["mysql"], "@tcp("); ok {
		myAddr, _, _ = strings.Cut(rest, ")")
	}
	for _, secret := range []string{"s3cretpw", "s3c/ret", "s3c@ret", "s3c:ret", "s3c%ret", "s3c?ret", "s3c#ret"} {
		// In parallel: most of the time goes in waiting for refusals.
		t.Run(secret, func(t *testing.T) {
			t.Parallel()
			testSecret(t, secret, redisAddr, pg, etcdAddr, zkAddr, myAddr)
		})
	}
}

func testSecret(t *testing.T, secret, redisAddr, pg, etcdAddr, zkAddr, myAddr string) {
	{
		for _, pw := range slices.Compact([]string{secret, url.QueryEscape(secret)}) {
			for _, lock := range []string{
				"redis://admin:" + pw + "@" + redisAddr,
				"redis://admin:" + pw + "@127.0.0.1:1",
				"redis://" + pw + "@" + redisAddr + "/1",
				"rediss://admin:" + pw + "@127.0.0.1:1/0",
				"redlock://admin:" + pw + "@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
				"etcd://root:" + pw + "@" + etcdAddr,
				"zk://super:" + pw + "@" + zkAddr,
				"postgres://warden:" + pw + "@" + pg,
				"postgres://warden@" + strings.Replace(pg, "?", "?password="+pw+"&", 1),
				"postgresql://127.0.0.1:1/warden?user=warden&password=" + pw,
				"mysql://warden:" + pw + "@tcp(" + myAddr + ")/warden",
				"mysql://warden:" + pw + "@tcp(127.0.0.1:1)/warden",
				"sqlite://warden:" + pw + "@/no/such/dir/x.db",
				"warden:" + pw + "@127.0.0.1:1",
				"ftp://admin:" + pw + "@127.0.0.1:1",
				"postgres://u:" + pw + "@[::1/db",
				"::" + pw + "::",
			} {
				// The test servers ask for no password: some answer.
				_, out, errOut := warden(t, "-lock", lock, "-timeout", "3s", "ping")
				for _, part := range []string{secret, pw, "s3c", "ret"} {
					if strings.Contains(out+errOut, part) {
						t.Errorf("-lock %s: the password shows: stdout %q stderr %q", lock, out, errOut)
						break
					}
				}
				if strings.Count(strings.TrimSuffix(errOut, "\n"), "\n") != 0 {
					t.Errorf("-lock %s: the error is not one line: %q", lock, errOut)
				}
			}
		}
	}
}

// TestErrorsAreOneLine: a backend that is not there is one line of stderr,
// whatever its client library logs; a SQLite file in a missing directory
// is reported with its path, as bad input (the CLI makes no database).
func TestErrorsAreOneLine(t *testing.T) {
	for _, lock := range []string{"redis://127.0.0.1:1", "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "etcd://127.0.0.1:1", "zk://127.0.0.1:1",
		"postgres://warden:warden@127.0.0.1:1/warden?sslmode=disable", "mysql://warden:warden@tcp(127.0.0.1:1)/warden"} {
		code, out, errOut := warden(t, "-lock", lock, "-timeout", "3s", "ping")
		if code != 1 || out != "" || strings.Count(strings.TrimSuffix(errOut, "\n"), "\n") != 0 || !strings.HasPrefix(errOut, "warden: ") {
			t.Errorf("ping %s: exit %d, stdout %q, stderr %q; want 1 and one line", lock, code, out, errOut)
		}
	}
	dir := filepath.Join(t.TempDir(), "no-such-dir")
	code, _, errOut := warden(t, "-lock", "sqlite://"+filepath.Join(dir, "x.db"), "ping")
	if code != 2 || !strings.Contains(errOut, dir) || strings.Contains(errOut, "out of memory") {
		t.Errorf("sqlite in a missing directory: exit %d, %q; want 2 and the directory named", code, errOut)
	}
}
