package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/debugpage"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// unsafeOutput reports what in out a terminal would obey or reorder: ESC
// and the other C0 controls but newline and tab, C1 controls, and
// bidirectional overrides.
func unsafeOutput(out string) string {
	for _, r := range out {
		if r < 0x20 && r != '\n' && r != '\t' || r >= 0x7f && r <= 0x9f || strings.ContainsRune("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069", r) {
			return fmt.Sprintf("%U", r)
		}
	}
	return ""
}

// decodedJSON is out, the CLI's JSON, decoded and printed again with Go's
// %v: the strings as a reader of the JSON gets them.
func decodedJSON(t *testing.T, out string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("output is not JSON: %v: %q", err, out)
	}
	return fmt.Sprint(v)
}

// outputURLs are the backends of the output tests: every backend of
// backendURLs, and Consul, whose 10 s minimum TTL the tests' locks (30 s,
// guard's default) respect.
func outputURLs(t *testing.T) map[string]string {
	urls := backendURLs(t)
	urls["consul"] = "consul://" + drivertest.Addr(t, "WARDEN_CONSUL_ADDR", "127.0.0.1:18500")
	return urls
}

// TestEscapesInOutput: a lock written to the backend by another client
// (guard refuses such keys and owners; a raw client does not) whose key and
// owner hold terminal escapes, a C1 CSI and a right-to-left override is
// listed and shown escaped, as is an idempotency record under such a key.
func TestEscapesInOutput(t *testing.T) {
	const evilOwner = "svc\x1b]0;pwned\x07\x1b[2J\u009b31m\u202eowned"
	for name, url := range outputURLs(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			u, o := open(t, url)
			locker := mustLocker(t, o, u)
			base := fmt.Sprintf("cli-esc/%s/%d/", name, time.Now().UnixNano())
			evilKey := base + "k\x1b[31m\u202e"
			if name == "zk" {
				evilKey = base + "k\u202e" // ZooKeeper refuses controls in node names
			}
			lease, err := locker.Acquire(ctx, "warden:"+evilKey, driver.AcquireOptions{TTL: 30 * time.Second, Owner: evilOwner})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lease.Release(context.Background()) })
			calm := base + "calm"
			lease2, err := locker.Acquire(ctx, "warden:"+calm, driver.AcquireOptions{TTL: 30 * time.Second, Owner: evilOwner})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lease2.Release(context.Background()) })

			code, out, errOut := cliRun(t, "", "-lock", url, "locks", "ls", base)
			if code != 0 || !strings.Contains(out, `\u202e`) || !strings.Contains(out, `svc\x1b]0;pwned\a\x1b[2J\u009b31m\u202eowned`) || unsafeOutput(out+errOut) != "" {
				t.Fatalf("locks ls: %d %q %q; want the key and owner escaped", code, out, errOut)
			}
			code, out, errOut = cliRun(t, "", "-lock", url, "-json", "locks", "ls", base)
			if code != 0 || unsafeOutput(out+errOut) != "" || !strings.Contains(out, `\u009b31m\u202eowned`) {
				t.Fatalf("-json locks ls: %d %q %q; want the C1 control and the override escaped", code, out, errOut)
			}
			if !strings.Contains(decodedJSON(t, out), evilOwner) {
				t.Fatalf("-json locks ls: %q decodes without the owner %q", out, evilOwner)
			}
			code, out, errOut = cliRun(t, "", "-lock", url, "locks", "show", calm)
			if code != 0 || !strings.Contains(out, `\x1b[2J`) || unsafeOutput(out+errOut) != "" {
				t.Fatalf("locks show: %d %q %q; want the owner escaped", code, out, errOut)
			}

			store, err := o.Store(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			idemKey := base + "\x1b[2J\u202e"
			if _, err := store.Claim(ctx, idempotency.Claim{Scope: "user-\x1b[31m", Key: idemKey, Fingerprint: "fp\x1b]0;x\x07",
				Owner: "api\u009b1m:tok", Lease: time.Minute}); err != nil {
				t.Fatal(err)
			}
			code, out, errOut = cliRun(t, "", "-lock", url, "idem", "show", "user-\x1b[31m", idemKey)
			if code != 0 || !strings.Contains(out, `fp\x1b]0;x\a`) || unsafeOutput(out+errOut) != "" {
				t.Fatalf("idem show: %d %q %q; want the record escaped", code, out, errOut)
			}
			code, out, errOut = cliRun(t, "", "-lock", url, "-json", "idem", "show", "user-\x1b[31m", idemKey)
			if code != 0 || unsafeOutput(out+errOut) != "" || !strings.Contains(decodedJSON(t, out), idemKey) {
				t.Fatalf("-json idem show: %d %q %q; want the record escaped and decoding to its key", code, out, errOut)
			}
			code, out, errOut = cliRun(t, "n\n", "-lock", url, "idem", "delete", "user-\x1b[31m", idemKey)
			if code != 1 || !strings.Contains(errOut, `\x1b[2J\u202e`) || unsafeOutput(out+errOut) != "" {
				t.Fatalf("idem delete prompt: %d %q %q; want the key escaped", code, out, errOut)
			}
		})
	}
}

// TestExecutorTokenNeverShown: an Executor's claim in progress is looked
// at with the CLI (table and JSON), on the debug page (HTML and JSON) and
// through the Executor's log, and its owner token, with which anyone could
// complete the claim with a forged response, appears in none of them.
func TestExecutorTokenNeverShown(t *testing.T) {
	for name, url := range outputURLs(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			u, o := open(t, url)
			store, err := o.Store(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			ex, err := idempotency.New(store, idempotency.WithScope("user-7"),
				idempotency.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("cli-token/%s/%d", name, time.Now().UnixNano())
			running, finish := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := ex.Do(ctx, key, "fp-1", func(context.Context) ([]byte, error) {
					close(running)
					<-finish
					return []byte("ok"), nil
				})
				done <- err
			}()
			<-running
			rec, err := store.Get(ctx, "user-7", key)
			if err != nil || rec.State != idempotency.StateInProgress || len(rec.Owner) < 16 {
				t.Fatalf("the claim: %+v, %v", rec, err)
			}
			token := rec.Owner

			var seen []string
			for _, args := range [][]string{{"idem", "show", "user-7", key}, {"-json", "idem", "show", "user-7", key}} {
				code, out, errOut := cliRun(t, "", append([]string{"-lock", url}, args...)...)
				if code != 0 || !strings.Contains(out, "in_progress") {
					t.Fatalf("%q: %d %q %q", args, code, out, errOut)
				}
				seen = append(seen, out, errOut)
			}
			g, err := guard.New(mustLocker(t, o, u))
			if err != nil {
				t.Fatal(err)
			}
			page, err := debugpage.New(g, debugpage.WithStore(store))
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{"", "&format=json"} {
				w := httptest.NewRecorder()
				page.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/warden?scope=user-7&key="+key+q, nil))
				if !strings.Contains(w.Body.String(), "in_progress") {
					t.Fatalf("debug page: %s", w.Body)
				}
				seen = append(seen, w.Body.String())
			}
			close(finish)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			seen = append(seen, logs.String())
			for _, s := range seen {
				if strings.Contains(s, token) || strings.Contains(s, token[len(token)/2:]) {
					t.Fatalf("the owner token %s is shown: %s", token, s)
				}
			}
			var js struct{ Instance string }
			if _, out, _ := cliRun(t, "", "-lock", url, "-json", "idem", "show", "user-7", key); json.Unmarshal([]byte(out), &js) != nil || js.Instance != "" {
				t.Fatalf("idem show -json: %s; want no instance (the token names none)", out)
			}
		})
	}
}

// open parses url and gives an Opener that the test's end closes.
func open(t *testing.T, url string) (*backendurl.URL, *backendurl.Opener) {
	t.Helper()
	u, err := backendurl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	o := backendurl.NewOpener()
	t.Cleanup(o.Close)
	return u, o
}

func mustLocker(t *testing.T, o *backendurl.Opener, u *backendurl.URL) driver.Locker {
	t.Helper()
	l, err := o.Locker(context.Background(), u, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestErrorLineIsEscaped: an error quoting a backend's bytes is printed as
// one line with what a terminal would obey escaped.
func TestErrorLineIsEscaped(t *testing.T) {
	got := oneLine("first\n\tsecond \x1b[2J\u009b\u202e\xff end")
	if want := `first;  second \x1b[2J\u009b\u202e` + "\ufffd end"; got != want {
		t.Fatalf("oneLine = %q, want %q", got, want)
	}
}

// TestEscapeUnprintable: C1 controls, bidirectional marks and a format
// character beyond the Basic Multilingual Plane come out of printJSON as
// escapes that decode back to the same strings.
func TestEscapeUnprintable(t *testing.T) {
	in := map[string]string{"k\u009b\u202e": "v\u2066\U000e0001 ok é 日本 \U0001f600"}
	var buf bytes.Buffer
	if err := (&cli{stdout: &gate{w: &buf}}).printJSON(in); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if u := unsafeOutput(out); u != "" || strings.Contains(out, "\U000e0001") {
		t.Fatalf("printJSON left %s raw: %q", u, out)
	}
	if !strings.Contains(out, `\u009b\u202e`) || !strings.Contains(out, `\udb40\udc01`) || !strings.Contains(out, "é 日本 \U0001f600") {
		t.Fatalf("printJSON: %q; want the controls escaped and printable text as it is", out)
	}
	var back map[string]string
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || len(back) != 1 || back["k\u009b\u202e"] != in["k\u009b\u202e"] {
		t.Fatalf("printJSON's output decodes to %q (%v); want %q", back, err, in)
	}
}

// openStore opens the idempotency store of url, on clients of its own.
func openStore(t *testing.T, url string) idempotency.Store {
	t.Helper()
	u, o := open(t, url)
	store, err := o.Store(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// TestPromptOnStderr: the question a release or delete asks goes to
// stderr, so that what -json prints on stdout is JSON alone when a script
// pipes its answer in.
func TestPromptOnStderr(t *testing.T) {
	ctx := context.Background()
	url := backendURLs(t)["redis"]
	key := fmt.Sprintf("cli-prompt/%d", time.Now().UnixNano())
	held, err := serviceGuard(t, url, "orders-svc/9", 2*time.Second).Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	code, out, errOut := cliRun(t, "y\n", "-lock", url, "-json", "locks", "release", key)
	if code != 0 || !json.Valid([]byte(out)) || !strings.Contains(errOut, `"orders-svc/9"`) || !strings.Contains(errOut, "[y/N]") {
		t.Fatalf("-json locks release answered y: exit %d, stdout %q, stderr %q; want JSON alone on stdout and the prompt on stderr", code, out, errOut)
	}

	store := openStore(t, url)
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "user-9", Key: key, Fingerprint: "fp", Owner: "api-1:tok", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cliRun(t, "y\n", "-lock", url, "-json", "idem", "delete", "user-9", key)
	if code != 0 || !json.Valid([]byte(out)) || !strings.Contains(errOut, "[y/N]") {
		t.Fatalf("-json idem delete answered y: exit %d, stdout %q, stderr %q; want JSON alone on stdout and the prompt on stderr", code, out, errOut)
	}
}

// TestQuotedOperands: a scope or key printed quoted and escaped (a NUL, a
// space at its end, as httpmw's hashed scopes and an Executor's binary keys
// have) can be given back as printed with -quoted, which argv could not
// carry as it is.
func TestQuotedOperands(t *testing.T) {
	ctx := context.Background()
	url := backendURLs(t)["redis"]
	store := openStore(t, url)
	scope := "\x00sha256:" + strings.Repeat("ab", 32)
	key := fmt.Sprintf("order\x00%d ", time.Now().UnixNano())
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: scope, Key: key, Fingerprint: "fp", Owner: "api-1:tok", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cliRun(t, "", "-lock", url, "-quoted", "idem", "show", strconv.Quote(scope), strconv.Quote(key))
	if code != 0 || !strings.Contains(out, strconv.Quote(scope)) || !strings.Contains(out, strconv.Quote(key)) {
		t.Fatalf("idem show of the quoted scope and key: exit %d, %q, %q; want the record, shown as it was named", code, out, errOut)
	}
	if code, out, errOut = cliRun(t, "", "-lock", url, "-yes", "-quoted", "idem", "delete", strconv.Quote(scope), strconv.Quote(key)); code != 0 {
		t.Fatalf("idem delete -yes of the quoted scope and key: exit %d, %q, %q", code, out, errOut)
	}
	if _, err := store.Get(ctx, scope, key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("the record after its delete: %v, want ErrNotFound", err)
	}
	if code, _, errOut = cliRun(t, "", "-lock", url, "-quoted", "idem", "show", `"unclosed`, `"k"`); code != 2 || !strings.Contains(errOut, "quoted") {
		t.Errorf("a badly quoted operand: exit %d, %q; want 2 and what is wrong", code, errOut)
	}
}

// TestQuotedAfter: -after takes the last key of a page as it was printed,
// quoted when it ends with a space, with -quoted as the operands.
func TestQuotedAfter(t *testing.T) {
	ctx := context.Background()
	url := backendURLs(t)["redis"]
	g := serviceGuard(t, url, "pager", 10*time.Second)
	prefix := fmt.Sprintf("cli-after/%d/", time.Now().UnixNano())
	for _, k := range []string{prefix + "a ", prefix + "b"} {
		l, err := g.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
	}
	code, out, errOut := cliRun(t, "", "-lock", url, "-limit", "1", "locks", "ls", prefix)
	first := strconv.Quote(prefix + "a ")
	if code != 0 || !strings.Contains(out, first) {
		t.Fatalf("the first page: exit %d, %q, %q; want %s", code, out, errOut, first)
	}
	code, out, errOut = cliRun(t, "", "-lock", url, "-limit", "1", "-quoted", "-after", first, "locks", "ls", strconv.Quote(prefix))
	if code != 0 || strings.Contains(out, first) || !strings.Contains(out, prefix+"b") {
		t.Errorf("the page after %s: exit %d, %q, %q; want %sb alone", first, code, out, errOut, prefix)
	}
}

// TestIdemJSONBytes: idem show -json gives a scope, key or fingerprint that
// is not UTF-8 (an Executor's are any bytes) in base64 too, as locks give
// such a key, since JSON shows each invalid byte as U+FFFD.
func TestIdemJSONBytes(t *testing.T) {
	ctx := context.Background()
	url := backendURLs(t)["redis"]
	store := openStore(t, url)
	scope, key, fp := "tenant-\xff", fmt.Sprintf("order-%d-\xfe", time.Now().UnixNano()), "\x9c\x00\xfa"
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: scope, Key: key, Fingerprint: fp, Owner: "api-1:tok", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cliRun(t, "", "-lock", url, "-json", "-quoted", "idem", "show", strconv.Quote(scope), strconv.Quote(key))
	var rec struct {
		ScopeBase64       string `json:"scope_base64"`
		KeyBase64         string `json:"key_base64"`
		FingerprintBase64 string `json:"fingerprint_base64"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rec) != nil {
		t.Fatalf("idem show -json: exit %d, %q, %q", code, out, errOut)
	}
	for name, got := range map[string][2]string{"scope": {rec.ScopeBase64, scope}, "key": {rec.KeyBase64, key}, "fingerprint": {rec.FingerprintBase64, fp}} {
		if b, err := base64.StdEncoding.DecodeString(got[0]); err != nil || string(b) != got[1] {
			t.Errorf("%s_base64 %q decodes to %q, %v; want %q", name, got[0], b, err, got[1])
		}
	}
}

// TestLeadingQuoteIsLiteral: without -quoted, a name that starts with a
// double quote is taken as it is, as -json prints it: a release of the key
// `"job"`, named from a script's JSON, released the lock on `job`, another
// service's, when such names were read as Go-quoted by their first
// character.
func TestLeadingQuoteIsLiteral(t *testing.T) {
	ctx := context.Background()
	url := backendURLs(t)["redis"]
	g := serviceGuard(t, url, "svc-a", 10*time.Second)
	plain := fmt.Sprintf("job-%d", time.Now().UnixNano())
	quoted := strconv.Quote(plain)
	held := map[string]*guard.Lock{}
	for _, k := range []string{plain, quoted} {
		l, err := g.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		held[k] = l
		defer l.Unlock(ctx)
	}
	if code, out, errOut := cliRun(t, "", "-lock", url, "-yes", "-any-holder", "locks", "release", quoted); code != 0 {
		t.Fatalf("release of %s: exit %d, %q, %q", quoted, code, out, errOut)
	}
	if err := held[plain].Err(); err != nil {
		t.Errorf("the lock on %s, which was not named: %v", plain, err)
	}
	code, out, errOut := cliRun(t, "", "-lock", url, "-json", "locks", "show", plain)
	if code != 0 || !strings.Contains(out, "svc-a") {
		t.Errorf("locks show %s after the release of %s: exit %d, %q, %q; want it still held by svc-a", plain, quoted, code, out, errOut)
	}
	code, out, errOut = cliRun(t, "", "-lock", url, "-json", "locks", "show", quoted)
	if code != 0 || strings.Contains(out, "svc-a") {
		t.Errorf("locks show %s after its release: exit %d, %q, %q; want it free", quoted, code, out, errOut)
	}
}
