package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// TestUsageShowsNoPasswordFromEnv: with the backend URLs in WARDEN_LOCK and
// WARDEN_STORE, as the usage suggests, asking for help, giving no command
// or mistyping a flag prints the usage, and a command that fails prints an
// error; neither shows the password, though the URL was read.
func TestUsageShowsNoPasswordFromEnv(t *testing.T) {
	const secret = "TopS3cretPw"
	t.Setenv("WARDEN_LOCK", "redis://:"+secret+"@127.0.0.1:1/0")
	t.Setenv("WARDEN_STORE", "redis://:"+secret+"@127.0.0.1:1/1")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "usage: warden"},
		{nil, "usage: warden"},
		{[]string{"-timeout", "1", "ping"}, "usage: warden"},
		{[]string{"-bogus"}, "usage: warden"},
		{[]string{"-json", "-timeout", "1s", "ping"}, "redis://xxxxx@127.0.0.1:1"},
	} {
		code, out, errOut := cliRun(t, "", tc.args...)
		if s := out + errOut; strings.Contains(s, secret) || !strings.Contains(s, tc.want) {
			t.Errorf("warden %q: exit %d, %q %q; want %q, and not the password", tc.args, code, out, errOut, tc.want)
		}
	}
}

// TestStoreFromEnv: the store's URL, which may hold a password as the lock
// backend's does, can come from WARDEN_STORE rather than argv, which ps
// shows; -store still wins.
func TestStoreFromEnv(t *testing.T) {
	url := "sqlite://" + filepath.Join(t.TempDir(), "store.db")
	store := openStore(t, url)
	const owner = "api-1:o"
	if _, err := store.Claim(context.Background(), idempotency.Claim{Scope: "s", Key: "k", Owner: owner, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WARDEN_STORE", url)
	lock := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	if code, out, errOut := cliRun(t, "", "-lock", lock, "idem", "show", "s", "k"); code != 0 || !strings.Contains(out, "in_progress") {
		t.Errorf("idem show with WARDEN_STORE: exit %d, %q, %q; want the record", code, out, errOut)
	}
	if code, _, errOut := cliRun(t, "", "-lock", lock, "-store", lock, "idem", "show", "s", "k"); code != 1 || !strings.Contains(errOut, "no record") {
		t.Errorf("idem show with -store and WARDEN_STORE: exit %d, %q; want -store's answer", code, errOut)
	}
}

// TestFlagErrorSaidOnce: a mistyped flag or a bad flag value prints the
// usage and then the error, once, as the last line.
func TestFlagErrorSaidOnce(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-bogus", "ping"}, "flag provided but not defined: -bogus"},
		{[]string{"-lock", "redis://127.0.0.1:1", "locks", "release", "-token", "k"}, `invalid value "k" for flag -token`},
	} {
		code, out, errOut := cliRun(t, "", tc.args...)
		if code != 2 || out != "" || strings.Count(errOut, tc.want) != 1 ||
			!strings.Contains(errOut, "usage: warden") || !strings.Contains(lastLine(errOut), tc.want) {
			t.Errorf("warden %q: exit %d, stdout %q, stderr %q; want 2, the usage, then %q once, last", tc.args, code, out, errOut, tc.want)
		}
	}
}

// TestOperands: flags may come before the command, among its words or
// after them; after --, words that start with '-' are operands.
func TestOperands(t *testing.T) {
	for _, tc := range []struct {
		args, want []string
		json       bool
	}{
		{[]string{"locks", "ls", "-json"}, []string{"locks", "ls"}, true},
		{[]string{"-json", "locks", "ls", "jobs/"}, []string{"locks", "ls", "jobs/"}, true},
		{[]string{"locks", "ls", "jobs/", "-json"}, []string{"locks", "ls", "jobs/"}, true},
		{[]string{"locks", "-json", "show", "k"}, []string{"locks", "show", "k"}, true},
		{[]string{"locks", "ls", "--", "-json"}, []string{"locks", "ls", "-json"}, false},
		{[]string{"idem", "show", "--", "-s", "-k"}, []string{"idem", "show", "-s", "-k"}, false},
		{[]string{"locks", "show", "-"}, []string{"locks", "show", "-"}, false},
	} {
		fs := flag.NewFlagSet("warden", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		js := fs.Bool("json", false, "")
		got, err := operands(fs, tc.args)
		if err != nil || !slices.Equal(got, tc.want) || *js != tc.json {
			t.Errorf("operands(%q) = %q, %v, -json %t; want %q, -json %t", tc.args, got, err, *js, tc.want, tc.json)
		}
	}
}

// TestFlagsAfterCommand: `warden locks ls -json` lists the locks as JSON
// (it took "-json" for the PREFIX, and printed an empty table: "no lock is
// held"), and so with every command; -token and -any-holder belong to
// locks release only.
func TestFlagsAfterCommand(t *testing.T) {
	url := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	g := serviceGuard(t, url, "orders-svc/7", 10*time.Second)
	prefix := fmt.Sprintf("cli-flags/%d/", time.Now().UnixNano())
	held, err := g.Lock(context.Background(), prefix+"k")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(context.Background())
	for _, args := range [][]string{
		{"locks", "ls", "-json"},
		{"locks", "ls", prefix, "-json", "-limit", "1000"},
		{"locks", "show", prefix + "k", "-json"},
	} {
		code, out, errOut := cliRun(t, "", append([]string{"-lock", url}, args...)...)
		if code != 0 || !json.Valid([]byte(out)) || !strings.Contains(out, prefix+"k") {
			t.Errorf("warden %q: exit %d, %q, %q; want the held lock as JSON", args, code, out, errOut)
		}
	}
	code, out, errOut := cliRun(t, "", "-lock", url, "locks", "ls", "--", "-json")
	if code != 0 || !strings.HasPrefix(out, "KEY") || strings.Contains(out, prefix) {
		t.Errorf("locks ls -- -json: exit %d, %q, %q; want the table of keys under -json: none", code, out, errOut)
	}
	code, _, errOut = cliRun(t, "", "-lock", url, "locks", "show", prefix+"k", "-token", "3")
	if code != 2 || !strings.Contains(errOut, "flags of locks release") {
		t.Errorf("locks show -token: exit %d, %q; want 2 and whose flag -token is", code, errOut)
	}
}

// TestShownUnambiguously: what the table shows of a key, owner or value
// tells it apart from any other, spaces at its ends included.
func TestShownUnambiguously(t *testing.T) {
	for in, want := range map[string]string{
		"jobs/nightly":  "jobs/nightly",
		"":              "-",
		"-":             `"-"`,
		"jobs/nightly ": `"jobs/nightly "`,
		" jobs/nightly": `" jobs/nightly"`,
		"jobs/\u00a0":   `"jobs/\u00a0"`,
		"a b":           "a b",
		`"a"`:           `"\"a\""`,
		"k\xff":         `"k\xff"`,
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestKeyBytesInJSON: a key that is not UTF-8, which another client wrote
// (guard refuses such keys), is listed in JSON with its exact bytes in
// KeyBase64, and a key with a trailing space is quoted in the table.
func TestKeyBytesInJSON(t *testing.T) {
	url := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	u, o := open(t, url)
	locker := mustLocker(t, o, u)
	base := fmt.Sprintf("cli-bytes/%d/", time.Now().UnixNano())
	for _, key := range []string{base + "k\xff\xfe", base + "space "} {
		lease, err := locker.Acquire(context.Background(), "warden:"+key, driver.AcquireOptions{TTL: 30 * time.Second, Owner: "raw-client"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lease.Release(context.Background()) })
	}
	code, out, errOut := cliRun(t, "", "-lock", url, "-json", "locks", "ls", base)
	var page []struct {
		guard.Inspection
		KeyBase64 string `json:"key_base64"`
	}
	if err := json.Unmarshal([]byte(out), &page); code != 0 || err != nil || len(page) != 2 {
		t.Fatalf("-json locks ls: exit %d, %q, %q, %v; want two locks", code, out, errOut, err)
	}
	for _, in := range page {
		key, err := base64.StdEncoding.DecodeString(in.KeyBase64)
		switch {
		case strings.HasSuffix(in.Key, "space "):
			if in.KeyBase64 != "" {
				t.Errorf("%q, a UTF-8 key, has KeyBase64 %q", in.Key, in.KeyBase64)
			}
		case err != nil || !bytes.Equal(key, []byte(base+"k\xff\xfe")):
			t.Errorf("%q: KeyBase64 %q decodes to %q, %v; want the key's bytes", in.Key, in.KeyBase64, key, err)
		}
	}
	code, out, errOut = cliRun(t, "", "-lock", url, "locks", "ls", base)
	if code != 0 || !strings.Contains(out, `"`+base+`space "`) || !strings.Contains(out, `"`+base+`k\xff\xfe"`) {
		t.Errorf("locks ls: exit %d, %q, %q; want both keys quoted", code, out, errOut)
	}
}

// TestErrorNamesWardenOnce: an error of guard's, which names warden
// already, is printed with the CLI's prefix once.
func TestErrorNamesWardenOnce(t *testing.T) {
	url := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	code, _, errOut := cliRun(t, "", "-lock", url, "locks", "show", "bad\x01key")
	if code != 2 || strings.Contains(errOut, "warden: warden:") || !strings.HasPrefix(errOut, `warden: lock "bad\x01key"`) {
		t.Errorf("locks show of an invalid key: exit %d, %q; want 2 and the error with one warden: prefix", code, errOut)
	}
}

// TestListOfAnInvalidPrefixIsBadInput: a prefix no key could start with
// (guard.List refuses it with ErrInvalidKey) is the operator's mistake, exit
// 2, as an invalid key is for locks show.
func TestListOfAnInvalidPrefixIsBadInput(t *testing.T) {
	url := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	code, _, errOut := cliRun(t, "", "-lock", url, "locks", "ls", "bad\x00prefix")
	if code != 2 || !strings.Contains(errOut, "invalid key") {
		t.Errorf("locks ls of an invalid prefix: exit %d, %q; want 2 and the key's error", code, errOut)
	}
}

// TestLsPagesTheWholeBackend: with -prefix "", locks ls lists every
// Guard's keys, longer than a key with their prefix; the last one of a page
// is the -after of the next.
func TestLsPagesTheWholeBackend(t *testing.T) {
	url := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	g := serviceGuard(t, url, "svc", 10*time.Second)
	ctx := context.Background()
	dir := fmt.Sprintf("ls-whole-%d/", time.Now().UnixNano())
	var keys []string
	for _, c := range "ab" {
		key := dir + strings.Repeat(string(c), guard.MaxKeyLen-len(dir))
		l, err := g.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		keys = append(keys, "warden:"+key)
	}
	after := ""
	for _, want := range keys {
		code, out, errOut := cliRun(t, "", "-lock", url, "-prefix", "", "-json", "-limit", "1", "-after", after, "locks", "ls", "warden:"+dir)
		var page []struct{ Key string }
		if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page) != 1 || page[0].Key != want {
			t.Fatalf("locks ls -after %.30q...: exit %d, %.100q, %q; want %.30q...", after, code, out, errOut, want)
		}
		after = page[0].Key
	}
}

// TestListPartwayThroughARuneOnEveryBackend: a prefix that ends partway
// through a rune lists the keys it starts on every backend, PostgreSQL,
// which refuses invalid UTF-8, included.
func TestListPartwayThroughARuneOnEveryBackend(t *testing.T) {
	ctx := context.Background()
	for name, url := range backendURLs(t) {
		g := serviceGuard(t, url, "svc", 10*time.Second)
		dir := fmt.Sprintf("ls-rune-%d/", time.Now().UnixNano())
		l, err := g.Lock(ctx, dir+"café")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		page, err := g.List(ctx, dir+"caf\xc3", "", 10)
		if err != nil || len(page) != 1 || page[0].Key != dir+"café" {
			t.Errorf("%s: List(%q): %v, %v; want the key café", name, dir+"caf\xc3", page, err)
		}
		l.Unlock(ctx)
	}
}

// TestLsSaysMoreFollow: a page that stops at -limit with more locks after
// it says so on stderr, naming the -after of the next page (quoted when
// the key is, to be given back with -quoted; and quoted for a shell when a
// character of it means something there); the page that holds the last
// lock says nothing, and stdout is the page alone, JSON included.
func TestLsSaysMoreFollow(t *testing.T) {
	url := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	g := serviceGuard(t, url, "svc", 10*time.Second)
	ctx := context.Background()
	dir := fmt.Sprintf("ls-more-%d/", time.Now().UnixNano())
	keys := []string{dir + "a", dir + "b c ", dir + "b it's", dir + "d"}
	for _, key := range keys {
		l, err := g.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
	}
	for _, tc := range []struct {
		args []string
		note string // on stderr, "" for none
	}{
		{[]string{"-limit", "1"}, "warden: more locks follow; the next page is -after " + dir + "a\n"},
		{[]string{"-limit", "2"}, "warden: more locks follow; the next page is -quoted -after '" + strconv.Quote(dir+"b c ") + "'\n"},
		{[]string{"-limit", "2", "-json"}, "warden: more locks follow; the next page is -quoted -after '" + strconv.Quote(dir+"b c ") + "'\n"},
		{[]string{"-limit", "3"}, "warden: more locks follow; the next page is -after '" + dir + "b it'\\''s'\n"},
		{[]string{"-limit", "4"}, ""},
		{[]string{"-limit", "3", "-after", dir + "a"}, ""},
	} {
		args := append([]string{"-lock", url, "locks", "ls", dir}, tc.args...)
		code, out, errOut := cliRun(t, "", args...)
		if code != 0 || errOut != tc.note {
			t.Errorf("locks ls %q: exit %d, stderr %q; want 0 and %q", tc.args, code, errOut, tc.note)
		}
		if slices.Contains(tc.args, "-json") && !json.Valid([]byte(out)) {
			t.Errorf("locks ls %q: stdout %q is not JSON alone", tc.args, out)
		}
	}
}

// TestShowOfAPrefixedName: an operator who names a key as the backend
// stores it, the Guard's prefix included (as redis-cli lists it), is told
// the key is free, which it is, and also that the key without the prefix
// is held: "free" alone would be read as the lock being free.
func TestShowOfAPrefixedName(t *testing.T) {
	url := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	g := serviceGuard(t, url, "svc", 10*time.Second)
	ctx := context.Background()
	key := fmt.Sprintf("show-prefixed-%d", time.Now().UnixNano())
	l, err := g.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	for _, args := range [][]string{{"locks", "show", "warden:" + key}, {"-json", "locks", "show", "warden:" + key}} {
		code, out, errOut := cliRun(t, "", append([]string{"-lock", url}, args...)...)
		want := fmt.Sprintf("warden: %s is held: keys are named without the Guard's prefix (-prefix %q)\n", key, "warden:")
		if code != 0 || errOut != want || strings.Contains(out, "svc") {
			t.Errorf("%q: exit %d, %q, %q; want the key free on stdout, and %q", args, code, out, errOut, want)
		}
	}
	if code, _, errOut := cliRun(t, "", "-lock", url, "locks", "show", "warden:"+key+"-not"); code != 0 || errOut != "" {
		t.Errorf("show of a prefixed name whose key is free too: exit %d, %q; want no note", code, errOut)
	}
	// So do ls, whose page is empty, and release, which has nothing to
	// release.
	code, out, errOut := cliRun(t, "", "-lock", url, "locks", "ls", "warden:"+key)
	want := fmt.Sprintf("warden: locks whose keys start with %s are held: keys are named without the Guard's prefix (-prefix %q)\n", key, "warden:")
	if code != 0 || errOut != want || strings.Contains(out, "svc") {
		t.Errorf("ls of a prefixed name: exit %d, %q, %q; want an empty page, and %q", code, out, errOut, want)
	}
	code, _, errOut = cliRun(t, "y\n", "-lock", url, "locks", "release", "warden:"+key)
	want = fmt.Sprintf("nothing to release (%s is held: keys are named without the Guard's prefix (-prefix %q))\n", key, "warden:")
	if code != 1 || !strings.HasSuffix(errOut, want) || l.Err() != nil {
		t.Errorf("release of a prefixed name: exit %d, %q; want 1, %q, and the lock kept", code, errOut, want)
	}
}

// TestLsOfTheGuardPrefixAlone: ls of the Guard's prefix alone, as the
// backend stores keys, lists nothing, and says that locks are held, named
// without it.
func TestLsOfTheGuardPrefixAlone(t *testing.T) {
	url := "sqlite://" + filepath.Join(t.TempDir(), "locks.db")
	g := serviceGuard(t, url, "svc", 10*time.Second)
	ctx := context.Background()
	l, err := g.Lock(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	code, out, errOut := cliRun(t, "", "-lock", url, "locks", "ls", "warden:")
	want := fmt.Sprintf("warden: locks are held: keys are named without the Guard's prefix (-prefix %q)\n", "warden:")
	if code != 0 || errOut != want || strings.Contains(out, "svc") {
		t.Errorf("ls of the Guard's prefix: exit %d, %q, %q; want an empty page, and %q", code, out, errOut, want)
	}
}

// TestSQLiteFileURI: a file: URI naming a file that is there is read as
// SQLite reads it (its path percent-decoded, an authority of localhost
// dropped), not refused as missing; one naming no file is refused.
func TestSQLiteFileURI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my dir")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "locks.db")
	g := serviceGuard(t, "sqlite://"+path, "svc", 10*time.Second)
	l, err := g.Lock(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	escaped := strings.ReplaceAll(path, " ", "%20")
	for _, lock := range []string{"sqlite://file:" + escaped, "sqlite://file://localhost" + escaped, "sqlite://file://" + escaped + "?mode=rw"} {
		if code, out, errOut := cliRun(t, "", "-lock", lock, "locks", "ls"); code != 0 || !strings.Contains(out, "orders") {
			t.Errorf("locks ls with -lock %s: exit %d, %q, %q; want 0 and the lock held", lock, code, out, errOut)
		}
	}
	lock := "sqlite://file:" + strings.ReplaceAll(filepath.Join(dir, "lcoks.db"), " ", "%20")
	if code, _, errOut := cliRun(t, "", "-lock", lock, "locks", "ls"); code != 2 || !strings.Contains(errOut, "does not exist") {
		t.Errorf("locks ls with -lock %s: exit %d, %q; want 2 and the file named missing", lock, code, errOut)
	}
}

// TestMissingSQLiteFile: a SQLite file that is not there (a typo in its
// path) is an error naming it, not an empty database made on the spot,
// whose empty listing would read as no lock held.
func TestMissingSQLiteFile(t *testing.T) {
	dir := t.TempDir()
	lock := "sqlite://" + filepath.Join(dir, "locks.db")
	serviceGuard(t, lock, "svc", 10*time.Second) // a service made the lock file
	if code, _, errOut := cliRun(t, "", "-lock", lock, "locks", "ls"); code != 0 {
		t.Fatalf("locks ls on the service's file: exit %d, %q", code, errOut)
	}
	for _, args := range [][]string{
		{"-lock", "sqlite://" + filepath.Join(dir, "lcoks.db"), "locks", "ls"},
		{"-lock", lock, "-store", "sqlite://" + filepath.Join(dir, "idem.db"), "idem", "show", "s", "k"},
	} {
		code, out, errOut := cliRun(t, "", args...)
		if code != 2 || !strings.Contains(errOut, "does not exist") || out != "" {
			t.Errorf("%q: exit %d, %q, %q; want 2 and the file named missing", args, code, out, errOut)
		}
	}
	for _, name := range []string{"lcoks.db", "idem.db"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v; want it not made", name, err)
		}
	}
}

// TestStoreFromEnvOnlyForTheStore: $WARDEN_STORE concerns the commands
// that use the store: a bad one fails none of the others, -store "" sets
// it aside for the lock backend's own store, memory is refused as it is
// for -lock, and a store that fails is named, redacted, with where it was
// given.
func TestStoreFromEnvOnlyForTheStore(t *testing.T) {
	lock := "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	t.Setenv("WARDEN_STORE", "bogus")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-lock", lock, "locks", "ls", "no-such-prefix-"}, 0, ""},
		{[]string{"-lock", lock, "idem", "show", "s", "k"}, 2, "$WARDEN_STORE: not a backend URL"},
		{[]string{"-lock", lock, "-store", "", "idem", "show", "no-such-scope", "k"}, 1, "no record"},
		{[]string{"-lock", lock, "-store", "memory", "idem", "show", "s", "k"}, 2, "-store memory: an in-process store"},
		{[]string{"-lock", lock, "-store", "redis://:TopS3cretPw@127.0.0.1:1/1", "-timeout", "2s", "idem", "show", "s", "k"}, 1, "-store redis://xxxxx@127.0.0.1:1/1: "},
	} {
		code, _, errOut := cliRun(t, "", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "TopS3cretPw") {
			t.Errorf("warden %q with WARDEN_STORE=bogus: exit %d, %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	t.Setenv("WARDEN_STORE", "memory")
	if code, _, errOut := cliRun(t, "", "-lock", lock, "idem", "show", "s", "k"); code != 2 || !strings.Contains(errOut, "$WARDEN_STORE memory: an in-process store") {
		t.Errorf("idem show with WARDEN_STORE=memory: exit %d, %q; want 2 and a refusal", code, errOut)
	}
}

// TestRecordsOnlyDatabase: on a database whose services keep idempotency
// records and take no locks (no lock table), ping says the database
// answers, and the idem commands, given the store by -store or
// $WARDEN_STORE, need no -lock; a lock command still does.
func TestRecordsOnlyDatabase(t *testing.T) {
	t.Setenv("WARDEN_LOCK", "")
	t.Setenv("WARDEN_STORE", "")
	url := "sqlite://" + filepath.Join(t.TempDir(), "records.db")
	if _, err := openStore(t, url).Claim(context.Background(), idempotency.Claim{Scope: "s", Key: "k", Owner: "api-1:o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := cliRun(t, "", "-lock", url, "ping"); code != 0 || !strings.Contains(out, "sqlite answered") {
		t.Errorf("ping on a database without a lock table: exit %d, %q, %q; want it answered", code, out, errOut)
	}
	if code, out, errOut := cliRun(t, "", "-store", url, "idem", "show", "s", "k"); code != 0 || !strings.Contains(out, "api-1") {
		t.Errorf("idem show with -store alone: exit %d, %q, %q; want the record", code, out, errOut)
	}
	for _, args := range [][]string{{"idem", "show", "s", "k"}, {"-store", "", "idem", "show", "s", "k"}} {
		if code, _, errOut := cliRun(t, "", args...); code != 2 || !strings.Contains(errOut, "no backend: give -store URL or -lock URL") {
			t.Errorf("%q with neither backend: exit %d, %q; want 2, asking for one", args, code, errOut)
		}
	}
	t.Setenv("WARDEN_STORE", url)
	if code, out, errOut := cliRun(t, "", "idem", "show", "s", "k"); code != 0 || !strings.Contains(out, "api-1") {
		t.Errorf("idem show with $WARDEN_STORE alone: exit %d, %q, %q; want the record", code, out, errOut)
	}
	if code, _, errOut := cliRun(t, "", "locks", "ls"); code != 2 || !strings.Contains(errOut, "no backend: give -lock URL") {
		t.Errorf("locks ls with $WARDEN_STORE alone: exit %d, %q; want 2, asking for -lock", code, errOut)
	}
}

// TestPasswordThatIsAWord: a password that is also a word the command
// prints (the test servers' own is "warden") is removed from what the
// backend said, and from nowhere else: the command's words, the Guard's,
// the key it names and the URL's database stay whole.
func TestPasswordThatIsAWord(t *testing.T) {
	pg := backendURLs(t)["postgres"]
	u, err := url.Parse(pg)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	if len(password) < 4 {
		t.Skipf("%s: a password of %d bytes, too short to be redacted", backendurl.Redact(pg), len(password))
	}
	key := password + "-report"
	// A database of the server without warden's tables.
	bare := *u
	bare.Path = "/postgres"
	// A Redis user with the password, refused the inspection's script:
	// its refusal comes back through the Guard, after the Guard's words.
	rs := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: rs.Addr()})
	defer admin.Close()
	if err := admin.Do(context.Background(), "acl", "setuser", "ops", "on", ">"+password, "+@all", "-evalsha", "-eval", "-evalsha_ro", "-eval_ro", "~*", "&*").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args   []string
		whole  string // the command's words, with the password in them
		masked string // the client library's, which quote it
	}{
		{[]string{"-lock", "postgres://ops:released@127.0.0.1:1/released?sslmode=disable", "locks", "release", "-any-holder", "-yes", "k"},
			`warden: "k" was not released: postgres://xxxxx@127.0.0.1:1/released?sslmode=disable: `, "database=xxxxx"},
		{[]string{"-store", "postgres://scope:scope@127.0.0.1:1/db?sslmode=disable", "idem", "delete", "-yes", "s", "k"},
			`warden: the record under scope "s", key "k" was not deleted: -store `, "user=xxxxx"},
		{[]string{"-lock", pg, "locks", "release", "-any-holder", "-yes", key},
			fmt.Sprintf("warden: %q is not held: nothing to release\n", key), ""},
		{[]string{"-lock", pg, "idem", "show", password, key},
			fmt.Sprintf("warden: no record under scope %q, key %q\n", password, key), ""},
		{[]string{"-lock", bare.String(), "locks", "ls"},
			"warden: " + backendurl.Redact(bare.String()) + ": no lock table warden_locks on this database", ""},
		{[]string{"-lock", "redis://ops:" + password + "@" + rs.Addr(), "locks", "show", key},
			fmt.Sprintf("warden: lock %q: ", key), "NOPERM"},
	} {
		code, _, errOut := cliRun(t, "", append([]string{"-timeout", "5s"}, tc.args...)...)
		if code != 1 || !strings.HasPrefix(errOut, tc.whole) || !strings.Contains(errOut, tc.masked) {
			t.Errorf("warden %q: exit %d, %q; want 1, starting %q, with %q", tc.args, code, errOut, tc.whole, tc.masked)
		}
	}
}

// TestRedactedKeepsTheGuardsWords: of a Guard's error, what the backend
// said is redacted, and the Guard's words before it are kept.
func TestRedactedKeepsTheGuardsWords(t *testing.T) {
	u, err := backendurl.Parse("postgres://warden:warden@db.internal/warden")
	if err != nil {
		t.Fatal(err)
	}
	backend := errors.New("dial postgres://warden:warden@db.internal/warden: refused (password warden)")
	got := redacted(u, fmt.Errorf("warden: lock %q: %w", "warden-report", backend)).Error()
	if want := `warden: lock "warden-report": dial postgres://xxxxx@db.internal/xxxxx: refused (password xxxxx)`; got != want {
		t.Errorf("redacted: %q, want %q", got, want)
	}
}
