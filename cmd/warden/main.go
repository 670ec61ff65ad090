// Command warden answers an operator's questions about warden's locks and
// idempotency records on a backend, and frees a lock whose holder hangs:
//
//	warden -lock redis://user:pass@127.0.0.1:6379/0 locks ls [PREFIX]
//	warden -lock etcd://10.0.0.1:2379 locks show KEY
//	warden -lock postgres://... locks release KEY      (asks first; -yes needs -token N or -any-holder)
//	warden -lock zk://10.0.0.5:2181 idem show SCOPE KEY
//	warden -lock zk://10.0.0.5:2181 idem delete SCOPE KEY    (asks first; -yes does not)
//	warden -lock mysql://... ping
//	warden -lock consul://127.0.0.1:8500 locks ls [PREFIX]
//
// Backend URLs are those of backendurl (and of the example service); -lock
// defaults to $WARDEN_LOCK. Keys are named as the services name them, under
// their Guard's prefix (-prefix, "warden:" by default, like guard.New's).
// Output is a table for people, or JSON with -json for scripts; a key, owner
// or value with a character a terminal would obey or reorder (controls,
// bidirectional marks) is printed quoted and escaped, as Go's %q does. URLs
// are printed redacted (backendurl). Exit status 0 on success, 1 when the
// backend fails or the answer is no, 2 for bad input (with a one-line
// error), 3 when a release is refused because the lock changed hands after
// its holder was shown (nothing is released; the new holder is named), or a
// delete because another request claimed the key after its record was
// shown (nothing is deleted).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/debugpage"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
)

func main() {
	// go-redis logs every failed dial of its pool to stderr; the error the
	// command returns says it once, on one line. (ZooKeeper's and etcd's
	// clients are quieted where backendurl opens them.)
	goredis.SetLogger(silent{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: warden [flags] COMMAND

commands:
  locks ls [PREFIX]      held locks whose keys start with PREFIX
  locks show KEY         who holds KEY, until when, and who waits
  locks release [-token N | -any-holder] KEY
                         take KEY from the holder shown (asks first; -yes
                         needs -token N, the holding's, or -any-holder)
  idem show SCOPE KEY    the idempotency record under SCOPE and KEY
  idem delete SCOPE KEY  remove that record, so the key runs afresh (asks first, unless -yes)
  ping                   whether the backend answers

flags:
`

// errUsage marks bad input: exit status 2.
type errUsage struct{ msg string }

func (e errUsage) Error() string { return e.msg }

func badInput(format string, args ...any) error { return errUsage{fmt.Sprintf(format, args...)} }

// cli is one invocation.
type cli struct {
	stdin  *bufio.Reader
	stdout io.Writer
	json   bool
	yes    bool
	limit  int
	after  string
	g      *guard.Guard
	store  func(context.Context) (idempotency.Store, error)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := runErr(ctx, args, stdin, stdout, stderr)
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "warden:", oneLine(err.Error()))
	var u errUsage
	if errors.As(err, &u) {
		return 2
	}
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return 1
}

func runErr(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("warden", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	c := &cli{stdin: bufio.NewReader(stdin), stdout: stdout}
	lock := fs.String("lock", os.Getenv("WARDEN_LOCK"), "lock backend URL (default $WARDEN_LOCK)")
	storeURL := fs.String("store", "", "idempotency store URL (default: the lock backend's own store)")
	prefix := fs.String("prefix", "warden:", "the services' Guard prefix (guard.WithPrefix)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on the whole command")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
	fs.BoolVar(&c.yes, "yes", false, "release or delete without asking")
	fs.IntVar(&c.limit, "limit", 100, "locks ls: at most this many locks (1 to 1000)")
	fs.StringVar(&c.after, "after", "", "locks ls: start after this key (for the next page)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage{err.Error()}
	}
	cmd := fs.Args()
	if len(cmd) == 0 {
		fs.Usage()
		return badInput("no command")
	}
	if *lock == "" {
		return badInput("no backend: give -lock URL or set WARDEN_LOCK")
	}
	if *timeout <= 0 {
		return badInput("-timeout %v is not positive", *timeout)
	}
	if c.limit < 1 || c.limit > 1000 {
		return badInput("-limit %d: want 1 to 1000", c.limit)
	}
	lockURL, err := backendurl.Parse(*lock)
	if err != nil {
		return badInput("-lock: %v", err)
	}
	// Whatever a client library put in an error, no password leaves here.
	defer func() { err = lockURL.RedactError(err) }()
	if lockURL.Scheme == "memory" {
		return badInput("-lock memory: an in-process backend holds nothing another process can see")
	}
	sURL := lockURL
	if *storeURL != "" {
		if sURL, err = backendurl.Parse(*storeURL); err != nil {
			return badInput("-store: %v", err)
		}
		defer func() { err = sURL.RedactError(err) }()
	}
	// The command is checked before anything is opened: a typo must not
	// wait for a connection.
	do, err := c.command(cmd)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	o := backendurl.NewOpener()
	defer o.Close()
	// The TTL only sizes ZooKeeper's session; nothing is locked here.
	locker, err := o.Locker(ctx, lockURL, 30*time.Second)
	if err != nil {
		return fmt.Errorf("%s: %w", lockURL, err)
	}
	// The command's own output is the record of what it did.
	opts := []guard.Option{guard.WithPrefix(*prefix), guard.WithOwner("warden-cli"), guard.WithBackendName(lockURL.Scheme),
		guard.WithLogger(slog.New(slog.DiscardHandler))}
	if lockURL.Scheme == "etcd" {
		opts = append(opts, guard.WithTTL(60*time.Second))
	}
	if c.g, err = guard.New(locker, opts...); err != nil {
		return badInput("%v", err)
	}
	c.store = func(ctx context.Context) (idempotency.Store, error) {
		s, err := o.Store(ctx, sURL)
		if errors.Is(err, backendurl.ErrNoStore) {
			return nil, badInput("%s has no idempotency store: give -store URL", sURL)
		}
		return s, err
	}
	return do(ctx)
}

// command returns what cmd asks for, or a usage error.
func (c *cli) command(cmd []string) (func(context.Context) error, error) {
	want := func(n int, what string) error {
		if len(cmd) != n {
			return badInput("%s: want %s", strings.Join(cmd[:min(len(cmd), 2)], " "), what)
		}
		return nil
	}
	switch strings.Join(cmd[:min(len(cmd), 2)], " ") {
	case "locks ls":
		if len(cmd) > 3 {
			return nil, badInput("locks ls: want at most a PREFIX")
		}
		prefix := ""
		if len(cmd) == 3 {
			prefix = cmd[2]
		}
		return func(ctx context.Context) error { return c.list(ctx, prefix) }, nil
	case "locks show":
		if err := want(3, "KEY"); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return c.show(ctx, cmd[2]) }, nil
	case "locks release":
		return c.releaseCommand(cmd[2:])
	case "idem show", "idem delete":
		if err := want(4, "SCOPE KEY"); err != nil {
			return nil, err
		}
		if err := idempotency.CheckKey(cmd[2], cmd[3]); err != nil {
			return nil, badInput("%v", err)
		}
		if cmd[1] == "delete" {
			return func(ctx context.Context) error { return c.idemDelete(ctx, cmd[2], cmd[3]) }, nil
		}
		return func(ctx context.Context) error { return c.idem(ctx, cmd[2], cmd[3]) }, nil
	}
	if cmd[0] == "ping" && len(cmd) == 1 {
		return c.ping, nil
	}
	return nil, badInput("unknown command %q (try -h)", strings.Join(cmd, " "))
}

func (c *cli) list(ctx context.Context, prefix string) error {
	page, err := c.g.List(ctx, prefix, c.after, c.limit)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(nonNil(page))
	}
	tw := c.table("KEY", "OWNER", "TOKEN", "EXPIRES IN", "WAITERS")
	for _, in := range page {
		for _, h := range in.Holders {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", shown(in.Key), shown(h.Owner), h.Token, expiresIn(h), waiters(in.Waiters))
		}
	}
	return tw.Flush()
}

func (c *cli) show(ctx context.Context, key string) error {
	in, err := c.g.Inspect(ctx, key)
	if err != nil {
		return badKeyOr(err)
	}
	if c.json {
		in.Holders = nonNil(in.Holders)
		return c.printJSON(in)
	}
	if len(in.Holders) == 0 {
		fmt.Fprintf(c.stdout, "%s is free (waiters: %s)\n", shown(key), waiters(in.Waiters))
		return nil
	}
	tw := c.table("KEY", "OWNER", "TOKEN", "EXPIRES IN", "WAITERS")
	for _, h := range in.Holders {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", shown(key), shown(h.Owner), h.Token, expiresIn(h), waiters(in.Waiters))
	}
	return tw.Flush()
}

func (c *cli) idem(ctx context.Context, scope, key string) error {
	s, err := c.store(ctx)
	if err != nil {
		return err
	}
	rec, err := s.Get(ctx, scope, key)
	if errors.Is(err, idempotency.ErrNotFound) {
		return fmt.Errorf("no record under scope %q, key %q", scope, key)
	}
	if err != nil {
		return err
	}
	// The owner token is a capability: only the instance it names, if any.
	instance := debugpage.Instance(rec.Owner)
	if c.json {
		return c.printJSON(struct {
			Scope         string `json:"scope"`
			Key           string `json:"key"`
			State         string `json:"state"`
			Fingerprint   string `json:"fingerprint"`
			Instance      string `json:"instance"`
			ResponseBytes int    `json:"response_bytes"`
		}{rec.Scope, rec.Key, string(rec.State), rec.Fingerprint, instance, len(rec.Response)})
	}
	tw := c.table("SCOPE", "KEY", "STATE", "FINGERPRINT", "INSTANCE", "RESPONSE")
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d bytes\n", shown(rec.Scope), shown(rec.Key), shown(string(rec.State)), shown(rec.Fingerprint), shown(instance), len(rec.Response))
	return tw.Flush()
}

func (c *cli) idemDelete(ctx context.Context, scope, key string) error {
	s, err := c.store(ctx)
	if err != nil {
		return err
	}
	del, ok := s.(idempotency.Deleter)
	if !ok {
		return fmt.Errorf("this store cannot delete records")
	}
	rec, err := s.Get(ctx, scope, key)
	if errors.Is(err, idempotency.ErrNotFound) {
		return fmt.Errorf("no record under scope %q, key %q", scope, key)
	}
	if err != nil {
		return err
	}
	if !c.yes {
		fmt.Fprintf(c.stdout, "delete the %s record of instance %s under scope %s, key %s? The next request with this key runs again. [y/N] ",
			shown(string(rec.State)), shown(debugpage.Instance(rec.Owner)), shown(scope), shown(key))
		answer, _ := c.stdin.ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return errors.New("not deleted")
		}
	}
	// Only the record shown: one claimed or completed by another request
	// since (the claim shown lapsed while the prompt waited) is left.
	if err := del.Delete(ctx, scope, key, rec.Owner); err != nil {
		if errors.Is(err, idempotency.ErrNotOwner) {
			return recordChanged{scope, key}
		}
		return err
	}
	if c.json {
		return c.printJSON(struct {
			Scope   string `json:"scope"`
			Key     string `json:"key"`
			Deleted bool   `json:"deleted"`
		}{scope, key, true})
	}
	fmt.Fprintf(c.stdout, "deleted the record under scope %q, key %q\n", scope, key)
	return nil
}

func (c *cli) ping(ctx context.Context) error {
	start := time.Now()
	if err := c.g.Ping(ctx); err != nil {
		return err
	}
	took := time.Since(start)
	if c.json {
		return c.printJSON(struct {
			Backend string  `json:"backend"`
			Ms      float64 `json:"ms"`
		}{c.g.Backend(), float64(took.Microseconds()) / 1000})
	}
	fmt.Fprintf(c.stdout, "%s answered in %v\n", c.g.Backend(), took.Round(10*time.Microsecond))
	return nil
}

func (c *cli) table(headers ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(headers, "\t"))
	return tw
}

// printJSON writes v as indented JSON. encoding/json escapes C0 controls
// but leaves C1 controls and bidirectional marks as they are, which a
// terminal shown `warden -json` would obey or reorder; they are escaped too,
// as \uXXXX, which any JSON reader decodes back to the same string.
func (c *cli) printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = c.stdout.Write(append(escapeUnprintable(b), '\n'))
	return err
}

// escapeUnprintable rewrites every rune of encoded JSON that strconv.IsPrint
// rejects as a \u escape. Outside strings JSON holds only printable ASCII and
// whitespace, so every such rune is inside a string, where the escape is
// valid; a rune beyond the Basic Multilingual Plane becomes its surrogate
// pair.
func escapeUnprintable(js []byte) []byte {
	if !bytes.ContainsFunc(js, func(r rune) bool { return r >= utf8.RuneSelf && !strconv.IsPrint(r) }) {
		return js
	}
	out := make([]byte, 0, len(js)+16)
	for len(js) > 0 {
		r, size := utf8.DecodeRune(js)
		if r < utf8.RuneSelf || strconv.IsPrint(r) {
			out = append(out, js[:size]...)
		} else if r1, r2 := utf16.EncodeRune(r); r1 != unicode.ReplacementChar {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		js = js[size:]
	}
	return out
}

// badKeyOr turns an invalid key into bad input.
func badKeyOr(err error) error {
	if errors.Is(err, guard.ErrInvalidKey) {
		return badInput("%v", err)
	}
	return err
}

func expiresIn(h guard.Holder) string {
	if h.SessionBound {
		return "with its session"
	}
	return h.TTL.Round(time.Millisecond).String()
}

func waiters(n int) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// shown is how a key, owner or value from a backend is printed for people:
// as it is, or "-" when empty, unless a terminal would obey or reorder some
// of it (C0 and C1 controls, bidirectional marks and overrides, anything
// unprintable or not UTF-8), or it starts with a quote; then quoted and
// escaped, as %q does, so that what is printed is what is there.
func shown(s string) string {
	if s == "" {
		return "-"
	}
	if !utf8.ValidString(s) || strings.HasPrefix(s, `"`) || strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

// oneLine is an error message as one line of stderr: the lines of a
// multi-line message joined, and whatever a terminal would obey (a backend
// may quote a stored key or label) escaped.
func oneLine(msg string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(msg, "\uFFFD") {
		switch {
		case r == '\n':
			b.WriteString("; ")
		case r == '\t':
			b.WriteByte(' ')
		case !strconv.IsPrint(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// silent is a go-redis logger that drops what it is given.
type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}

// nonNil makes an empty list print as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
