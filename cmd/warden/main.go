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
// Flags may come before the command, among its words or after them; after
// --, every word is an operand, even one that starts with '-' (locks show
// -- -key). Backend
// URLs are those of backendurl (and of the example service); -lock
// defaults to $WARDEN_LOCK, and -store to $WARDEN_STORE, so that a URL's
// password need not be in the command's arguments, which ps shows to
// every user of the machine (-store "" names the lock backend's own
// store over $WARDEN_STORE, which only the idem commands read; given a
// store, they need no -lock). ping says whether the backend answers: on
// SQL it reads no table, so that a database of records alone answers. A
// sqlite:// file must exist, and a SQL backend's tables too: the command
// makes no database and changes no schema, so that a user that may only
// read the tables (a replica, a read-only SQLite file) can look, and one
// that may write their rows can release and delete. Keys are
// named as the services name them, under their Guard's prefix (-prefix,
// "warden:" by default, like guard.New's), not as the backend stores
// them: locks show, ls and release of a name that starts with the prefix,
// and names no lock, say on stderr when the name without it does.
// locks ls lists a page of at most -limit locks; when more follow, a note
// on stderr names the -after of the next page.
// Output is a table for people, or JSON with -json for scripts; a key, owner
// or value with a character a terminal would obey or reorder (controls,
// bidirectional marks), or a space at either end, is printed quoted and
// escaped, as Go's %q does; with -quoted, every PREFIX, KEY, SCOPE and
// -after is read back that way, so that what is printed can be named, a NUL
// included (without it, every name is taken as it is, as -json prints
// names, so that a key that starts with a quote names itself). A key that
// is not UTF-8 (another client wrote it; guard refuses such keys) is given
// in JSON as key_base64 too, its bytes exactly, since JSON shows each
// invalid byte as U+FFFD, and so are an idempotency record's scope, key and
// fingerprint (scope_base64, key_base64, fingerprint_base64). URLs, in
// usage and errors too, are printed redacted (backendurl), and so is what
// a backend says in an error (its client library may quote a password):
// the command's own words around it, and the keys and URLs it names, are
// printed whole, even where a password is a word of them.
//
// -timeout bounds the backend's part of the command: opening the clients
// and every call, which the command abandons, failing, should a client not
// heed it. The time an operator takes to answer a prompt is not counted:
// the bound starts again after the answer. The first Ctrl-C ends the
// command as the bound would; a second one ends the process at once.
//
// A question (release or delete, unless -yes) is asked on stderr, and
// the answer read from stdin: stdout holds the output alone.
//
// Exit status 0 on success; 1 when the backend fails, the answer is no, or
// there is nothing to release or delete (a release or delete that failed
// says that it was not done when its request was never sent, the backend
// out of reach, and that it may have been done when its answer never
// came); 2 for bad input (with a one-line error); 3 when a release is
// refused because the lock changed hands after its holder was shown
// (nothing is released; the new holder is named), or a delete because
// another request claimed the key after its record was shown (nothing is
// deleted); 4 when locks ls found locks it could not read (another user's,
// under the backend's access control, such as a ZooKeeper ACL): the page
// is printed with a "?" row for each (-json: an "error" field, and null
// holders and waiters), and the error names the first; a "?" row says
// nothing of whether the lock is held (a backend keeps a lock's keys after
// its last holder). It is 4 too when the backend left such locks out of
// the page saying only that it did (Consul's ACLs): the error says so.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/debugpage"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

func main() {
	// go-redis logs every failed dial of its pool to stderr; the error the
	// command returns says it once, on one line. (ZooKeeper's and etcd's
	// clients are quieted where backendurl opens them.)
	goredis.SetLogger(silent{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	// After the first Ctrl-C, which ends the command, the signal's default
	// is back: a second one ends the process at once.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: warden [flags] COMMAND [flags]

commands:
  locks ls [PREFIX]      held locks whose keys start with PREFIX
  locks show KEY         who holds KEY, until when, and who waits
  locks release [-token N | -any-holder] KEY
                         take KEY from the holder shown (asks first; -yes
                         needs -token N, the holding's, or -any-holder)
  idem show SCOPE KEY    the idempotency record under SCOPE and KEY
  idem delete SCOPE KEY  remove that record, so the key runs afresh (asks first, unless -yes)
  ping                   whether the backend answers

Flags may also follow the command; after --, every word is an operand,
even one starting with '-' (locks show -- -KEY). With -quoted, every
PREFIX, KEY, SCOPE and -after is a Go-quoted string, as a table shows
the names it quotes ("a\x00b"); without it, each is taken as it is.

flags:
`

// errUsage marks bad input: exit status 2.
type errUsage struct{ msg string }

func (e errUsage) Error() string { return e.msg }

func badInput(format string, args ...any) error { return errUsage{fmt.Sprintf(format, args...)} }

// cli is one invocation.
type cli struct {
	stdin  *bufio.Reader
	stdout *gate
	// stderr is where questions and notes go, so that stdout holds only
	// the output, JSON alone with -json when a script pipes its answer in.
	stderr    io.Writer
	json      bool
	yes       bool
	limit     int
	after     string
	quoted    bool   // names given Go-quoted (-quoted)
	prefix    string // the services' Guard prefix (-prefix)
	token     uint64 // locks release -token
	tokenSet  bool
	anyHolder bool // locks release -any-holder
	timeout   time.Duration
	deadline  time.Time // the end of the current bound on the backend's part
	abandoned bool      // a call outlived its bound, and may still use the clients
	g         locks     // nil for the idem commands, which need no lock backend, and ping on SQL
	// backend names what ping asks, and pinger asks it: the Guard's
	// backend, or a SQL database's connection pool.
	backend string
	pinger  func(context.Context) error
	store   func(context.Context) (idempotency.Store, error)
	// storeURL is the store's URL, whose secrets are removed from what
	// the store says (see redacted).
	storeURL *backendurl.URL
	change   *change // what a release or delete says when it fails; nil for the other commands
}

// grace is how long past its bound a call is waited for before it is
// abandoned: enough for a client that heeds its context to return, short
// enough that the bound (and a Ctrl-C) holds.
const grace = 500 * time.Millisecond

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := runErr(ctx, args, stdin, stdout, stderr)
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	// guard's errors name warden already.
	fmt.Fprintln(stderr, "warden:", strings.TrimPrefix(oneLine(err.Error()), "warden: "))
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
	// The flag package prints a parse error before the usage; run prints
	// it after, as the last line, like every other error: once is enough.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	printUsage := func() {
		fmt.Fprint(stderr, usage)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
	}
	c := &cli{stdin: bufio.NewReader(stdin), stdout: &gate{w: stdout}, stderr: stderr}
	// Not $WARDEN_LOCK or $WARDEN_STORE as the default: the usage would
	// print its password.
	lock := fs.String("lock", "", "lock backend URL (default $WARDEN_LOCK; the idem commands need it only for its own store)")
	storeURL := fs.String("store", "", "idempotency store URL (default $WARDEN_STORE, or the lock backend's own store, which -store '' names)")
	fs.StringVar(&c.prefix, "prefix", "warden:", "the services' Guard prefix (guard.WithPrefix)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "bound on the backend's part of the command (an operator's answer to a prompt starts it again)")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
	fs.BoolVar(&c.yes, "yes", false, "release or delete without asking")
	fs.IntVar(&c.limit, "limit", 100, "locks ls: at most this many locks (1 to 1000); when more follow, stderr names the next page's -after")
	fs.StringVar(&c.after, "after", "", "locks ls: start after this key (for the next page)")
	fs.BoolVar(&c.quoted, "quoted", false, "every PREFIX, KEY, SCOPE and -after is a Go-quoted string, as a table shows the names it quotes")
	fs.Uint64Var(&c.token, "token", 0, "locks release: the token of the holding to release, as locks show printed it")
	fs.BoolVar(&c.anyHolder, "any-holder", false, "locks release: release whoever holds the key when the release runs")
	cmd, err := operands(fs, args)
	if err != nil {
		printUsage()
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage{err.Error()}
	}
	storeSet := false
	fs.Visit(func(f *flag.Flag) {
		c.tokenSet = c.tokenSet || f.Name == "token"
		storeSet = storeSet || f.Name == "store"
	})
	if len(cmd) == 0 {
		printUsage()
		return badInput("no command")
	}
	if *lock == "" {
		*lock = os.Getenv("WARDEN_LOCK")
	}
	if !storeSet {
		*storeURL = os.Getenv("WARDEN_STORE")
	}
	// The idem commands open the store alone: given one, they need no
	// lock backend.
	idem := cmd[0] == "idem"
	if *lock == "" && (!idem || *storeURL == "") {
		if idem {
			return badInput("no backend: give -store URL or -lock URL, or set WARDEN_STORE or WARDEN_LOCK")
		}
		return badInput("no backend: give -lock URL or set WARDEN_LOCK")
	}
	if c.timeout <= 0 {
		return badInput("-timeout %v is not positive", c.timeout)
	}
	if c.limit < 1 || c.limit > 1000 {
		return badInput("-limit %d: want 1 to 1000", c.limit)
	}
	var lockURL *backendurl.URL
	if *lock != "" {
		if lockURL, err = backendurl.Parse(*lock); err != nil {
			return badInput("-lock: %v", err)
		}
		if lockURL.Scheme == "memory" {
			return badInput("-lock memory: an in-process backend holds nothing another process can see")
		}
		if err := sqliteMissing("-lock", lockURL); err != nil {
			return err
		}
	}
	// -store "" names the lock backend's own store, over $WARDEN_STORE.
	st := store{flag: "-lock", url: lockURL}
	if *storeURL != "" {
		st = parseStore(storeSet, *storeURL)
	}
	// The command is checked before anything is opened: a typo must not
	// wait for a connection.
	do, err := c.command(cmd)
	if err != nil {
		return err
	}

	c.restartBound()
	o := backendurl.NewOpener()
	// Looking needs no right to change the schema, nor does a release (a
	// replica, an auditor's role); a database no service has used is
	// refused rather than given tables.
	o.KeepSchema = true
	defer c.close(o)
	if err := c.bounded(ctx, func(ctx context.Context) error { return c.open(ctx, o, lockURL, st, cmd[0]) }); err != nil {
		return c.change.before(ctx, err)
	}
	return do(ctx)
}

// operands parses args with fs, whose flags may come before, among or after
// the command's words, and returns the words: every word after --, even
// one that starts with '-'.
func operands(fs *flag.FlagSet, args []string) ([]string, error) {
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(words, rest...), nil
		}
		if len(rest) == 0 {
			return words, nil
		}
		words = append(words, rest[0])
		args = rest[1:]
	}
}

// store is the idempotency store's URL, and where it was given: -store,
// $WARDEN_STORE, or -lock for the lock backend's own.
type store struct {
	flag string
	url  *backendurl.URL
	err  error // what is wrong with the URL, said to the commands that use it
}

// parseStore reads the store's URL, given with -store (flagged) or in
// $WARDEN_STORE. A URL that is wrong fails only the commands that use the
// store: a bad $WARDEN_STORE must not stop locks ls.
func parseStore(flagged bool, s string) store {
	st := store{flag: "$WARDEN_STORE"}
	if flagged {
		st.flag = "-store"
	}
	u, err := backendurl.Parse(s)
	switch {
	case err != nil:
		st.err = badInput("%s: %v", st.flag, err)
	case u.Scheme == "memory":
		st.err = badInput("%s memory: an in-process store holds nothing another process wrote", st.flag)
	default:
		st.url = u
	}
	return st
}

// open opens what command (its first word) needs: the lock backend, and,
// when a command asks for it, the store. The idem commands leave the lock
// backend alone, and ping only opens a SQL database, reading no table: a
// database whose services keep idempotency records and take no locks has
// no lock table, which would fail the Locker's open.
func (c *cli) open(ctx context.Context, o *backendurl.Opener, lockURL *backendurl.URL, st store, command string) error {
	c.storeURL = st.url
	c.store = func(ctx context.Context) (idempotency.Store, error) {
		if st.err != nil {
			return nil, st.err
		}
		if err := sqliteMissing(st.flag, st.url); err != nil {
			return nil, err
		}
		s, err := o.Store(ctx, st.url)
		if errors.Is(err, backendurl.ErrNoStore) {
			return nil, badInput("%s %s has no idempotency store: give -store URL", st.flag, st.url)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", st.flag, st.url, err)
		}
		return s, nil
	}
	if command == "idem" {
		return nil
	}
	if command == "ping" && lockURL.SQL() {
		db, err := o.SQL(ctx, lockURL)
		if err != nil {
			return fmt.Errorf("%s: %w", lockURL, err)
		}
		pool, err := db.DB()
		if err != nil {
			return lockURL.RedactError(err)
		}
		c.backend = lockURL.Scheme
		c.pinger = func(ctx context.Context) error { return lockURL.RedactError(pool.PingContext(ctx)) }
		return nil
	}
	// The TTL only sizes ZooKeeper's session; nothing is locked here.
	locker, err := o.Locker(ctx, lockURL, 30*time.Second)
	if err != nil {
		return fmt.Errorf("%s: %w", lockURL, err)
	}
	// The command's own output is the record of what it did.
	opts := []guard.Option{guard.WithPrefix(c.prefix), guard.WithOwner("warden-cli"), guard.WithBackendName(lockURL.Scheme),
		guard.WithLogger(slog.New(slog.DiscardHandler))}
	if lockURL.Scheme == "etcd" {
		opts = append(opts, guard.WithTTL(60*time.Second))
	}
	g, err := guard.New(locker, opts...)
	if err != nil {
		return badInput("%v", lockURL.RedactError(err))
	}
	c.g = redactedGuard{g, lockURL}
	c.backend, c.pinger = g.Backend(), c.g.Ping
	return nil
}

// locks is what the lock commands ask of the Guard, every error redacted:
// a redactedGuard.
type locks interface {
	Inspect(ctx context.Context, key string) (guard.Inspection, error)
	List(ctx context.Context, prefix, after string, limit int) ([]guard.Inspection, error)
	ForceRelease(ctx context.Context, key string, target guard.ReleaseTarget) ([]guard.Holder, error)
	Ping(ctx context.Context) error
}

// redactedGuard is a Guard whose errors have the lock URL's secrets
// removed from what the backend said (see redacted), before the command
// wraps them in its own words.
type redactedGuard struct {
	g   *guard.Guard
	url *backendurl.URL
}

func (r redactedGuard) Inspect(ctx context.Context, key string) (guard.Inspection, error) {
	in, err := r.g.Inspect(ctx, key)
	return in, redacted(r.url, err)
}

func (r redactedGuard) List(ctx context.Context, prefix, after string, limit int) ([]guard.Inspection, error) {
	page, err := r.g.List(ctx, prefix, after, limit)
	for i := range page {
		page[i].Err = redacted(r.url, page[i].Err)
	}
	return page, redacted(r.url, err)
}

func (r redactedGuard) ForceRelease(ctx context.Context, key string, target guard.ReleaseTarget) ([]guard.Holder, error) {
	removed, err := r.g.ForceRelease(ctx, key, target)
	return removed, redacted(r.url, err)
}

func (r redactedGuard) Ping(ctx context.Context) error { return redacted(r.url, r.g.Ping(ctx)) }

// redacted is err, an error of the Guard's, with u's secrets removed from
// what the backend said, which may quote a client library's words, and
// the Guard's own words before it (warden, the key, the call), which
// quote none, kept: a password that is also a word (the test servers'
// "warden") would otherwise be masked in "warden: lock" and in a key. The
// command's words around it are its own, and are not redacted either:
// every error of a backend reaches the command through redacted, or
// through u.RedactError, as soon as it is returned, but the Opener's,
// which show no secret (backendurl redacts them, its own words kept).
func redacted(u *backendurl.URL, err error) error {
	cause := errors.Unwrap(err)
	if cause == nil {
		return u.RedactError(err)
	}
	words, ok := strings.CutSuffix(err.Error(), cause.Error())
	if !ok {
		return u.RedactError(err)
	}
	clean := u.RedactError(cause)
	if clean == cause {
		return err
	}
	return &redactedError{words + clean.Error(), err}
}

// redactedError is an error whose message is err's with secrets removed.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// sqliteMissing returns a usage error when u, given with flag, names a
// SQLite file that is not there (a typo in its path): opening it would make
// an empty database, whose answers would read as no lock held and no
// record kept.
func sqliteMissing(flag string, u *backendurl.URL) error {
	if u.Scheme != "sqlite" {
		return nil
	}
	name, ok := sqliteFile(u.Path)
	if !ok {
		return nil // SQLite says what is wrong with it
	}
	if _, err := os.Stat(name); errors.Is(err, fs.ErrNotExist) {
		return badInput("%s %s: the file does not exist (warden reads what services wrote; it makes no database)", flag, u)
	}
	return nil
}

// sqliteFile returns the file an SQLite path names, as SQLite reads it: a
// plain path as it is, a file: URI's path percent-decoded, its authority
// (empty or localhost) dropped; ok is false for a URI SQLite would refuse.
func sqliteFile(path string) (name string, ok bool) {
	name, _, _ = strings.Cut(path, "?")
	uri, isURI := strings.CutPrefix(name, "file:")
	if !isURI {
		return name, true
	}
	uri, _, _ = strings.Cut(uri, "#")
	if rest, hasAuthority := strings.CutPrefix(uri, "//"); hasAuthority {
		authority, p, _ := strings.Cut(rest, "/")
		if authority != "" && authority != "localhost" {
			return "", false
		}
		uri = "/" + p
	}
	name, err := url.PathUnescape(uri)
	return name, err == nil
}

// restartBound starts the bound on the backend's part of the command: at
// the start, and again after the operator answered a prompt.
func (c *cli) restartBound() { c.deadline = time.Now().Add(c.timeout) }

// bounded runs f with ctx ended at the bound, and returns f's error; or,
// should f not return within grace of its context's end (a client that does
// not heed it), an error saying that the backend did not answer, leaving f
// behind: what it prints later is dropped, and the clients are not closed
// under it.
func (c *cli) bounded(ctx context.Context, f func(context.Context) error) error {
	fctx, cancel := context.WithDeadline(ctx, c.deadline)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(fctx) }()
	var err error
	select {
	case err = <-done:
	case <-fctx.Done():
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case err = <-done:
		case <-t.C:
			c.abandoned = true
			c.stdout.close()
			err = fmt.Errorf("%w: no answer within -timeout %v", driver.ErrUnavailable, c.timeout)
		}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// Ctrl-C: say so, rather than what a client made of it.
		return context.Cause(ctx)
	case errors.Is(err, context.DeadlineExceeded) && fctx.Err() != nil:
		return about(fmt.Sprintf("no answer within -timeout %v", c.timeout), err)
	}
	return err
}

// close closes what o opened, waiting at most grace; not at all after a
// call was abandoned, whose goroutine may still be using the clients.
func (c *cli) close(o *backendurl.Opener) {
	if c.abandoned {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.Close()
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// ask prints question on c.stderr and reports whether the operator
// answered yes. The answer is awaited without a bound, but Ctrl-C ends the
// wait.
func (c *cli) ask(ctx context.Context, question string) (bool, error) {
	io.WriteString(c.stderr, question)
	answer := make(chan string, 1)
	go func() {
		a, _ := c.stdin.ReadString('\n')
		answer <- a
	}()
	select {
	case a := <-answer:
		a = strings.ToLower(strings.TrimSpace(a))
		return a == "y" || a == "yes", nil
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
}

// gate is the command's standard output, closed when a call is abandoned:
// the command has failed, and what the call prints afterwards goes nowhere.
type gate struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gate) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return len(p), nil
	}
	return g.w.Write(p)
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
}

// command returns what cmd, the command's words without its flags, asks
// for, or a usage error. What it returns opens nothing: it runs once the
// backend is open, and bounds its own calls (bounded).
func (c *cli) command(cmd []string) (func(context.Context) error, error) {
	name := strings.Join(cmd[:min(len(cmd), 2)], " ")
	want := func(n int, what string) error {
		if len(cmd) != n {
			return badInput("%s: want %s", name, what)
		}
		return nil
	}
	if name != "locks release" && (c.tokenSet || c.anyHolder) {
		return nil, badInput("-token and -any-holder are flags of locks release")
	}
	if c.quoted {
		for i := 2; i < len(cmd); i++ {
			var err error
			if cmd[i], err = unquoted(cmd[i]); err != nil {
				return nil, err
			}
		}
		if c.after != "" {
			var err error
			if c.after, err = unquoted(c.after); err != nil {
				return nil, err
			}
		}
	}
	// One bound on the backend's part for a command that asks nothing.
	bounded := func(f func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error { return c.bounded(ctx, f) }
	}
	switch name {
	case "locks ls":
		if len(cmd) > 3 {
			return nil, badInput("locks ls: want at most a PREFIX")
		}
		prefix := ""
		if len(cmd) == 3 {
			prefix = cmd[2]
		}
		return c.noted(func(ctx context.Context) (string, error) { return c.list(ctx, prefix) }), nil
	case "locks show":
		if err := want(3, "KEY"); err != nil {
			return nil, err
		}
		return c.noted(func(ctx context.Context) (string, error) { return c.show(ctx, cmd[2]) }), nil
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
			record := fmt.Sprintf("the record under scope %q, key %q", cmd[2], cmd[3])
			c.change = &change{
				notDone:   record + " was not deleted",
				mayBeDone: record + " may have been deleted; warden idem show tells",
			}
			return func(ctx context.Context) error { return c.idemDelete(ctx, cmd[2], cmd[3]) }, nil
		}
		return bounded(func(ctx context.Context) error { return c.idem(ctx, cmd[2], cmd[3]) }), nil
	}
	if cmd[0] == "ping" && len(cmd) == 1 {
		return bounded(c.ping), nil
	}
	if subs, ok := map[string]string{"locks": "ls, show or release", "idem": "show or delete"}[cmd[0]]; ok && len(cmd) == 1 {
		return nil, badInput("%s needs a command after it: %s (try -h)", cmd[0], subs)
	}
	return nil, badInput("unknown command %q (try -h)", strings.Join(cmd, " "))
}

// noted is f as a command: f runs within the bound, and the note it
// returns, if any, is printed on stderr after its output (never by a call
// the bound abandoned).
func (c *cli) noted(f func(context.Context) (string, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		var note string
		err := c.bounded(ctx, func(ctx context.Context) (err error) {
			note, err = f(ctx)
			return err
		})
		if err != nil && !errors.As(err, new(unreadable)) {
			return err
		}
		// f returned (locks it could not read are its answer, not the
		// bound's): its note stands.
		if note != "" {
			fmt.Fprintln(c.stderr, "warden: "+note)
		}
		return err
	}
}

// list prints a page of the held locks whose keys start with prefix, and
// returns a note naming the next page when more locks follow it, or, for
// an empty page, saying when the prefix without the Guard's is held.
func (c *cli) list(ctx context.Context, prefix string) (string, error) {
	page, partial := c.g.List(ctx, prefix, c.after, c.limit)
	if partial != nil && !errors.Is(partial, guard.ErrPartialList) {
		return "", badKeyOr(partial)
	}
	note := ""
	if bare, ok := strings.CutPrefix(prefix, c.prefix); ok && len(page) == 0 && c.after == "" && c.prefix != "" {
		// No lock under a prefix copied from the backend, the Guard's
		// included.
		note = c.unprefixedLocks(ctx, bare)
	}
	// A full page may be all there is, or the first of many; an operator
	// told nothing would take the first hundred for all of them.
	if len(page) == c.limit {
		last := page[len(page)-1].Key
		more, err := c.g.List(ctx, prefix, last, 1)
		if err != nil && !errors.Is(err, guard.ErrPartialList) {
			return "", err
		}
		if len(more) > 0 {
			note = nextPage(last)
		}
	}
	if c.json {
		out := make([]inspection, len(page))
		for i, in := range page {
			out[i] = inspected(in)
		}
		if err := c.printJSON(out); err != nil {
			return note, err
		}
		return note, unreadableIn(page, partial)
	}
	tw := c.table("KEY", "OWNER", "TOKEN", "EXPIRES IN", "WAITERS")
	for _, in := range page {
		if in.Err != nil {
			fmt.Fprintf(tw, "%s\t?\t?\t?\t?\n", shown(in.Key))
		}
		for _, h := range in.Holders {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", shown(in.Key), shown(h.Owner), h.Token, expiresIn(h), waiters(in.Waiters))
		}
	}
	if err := tw.Flush(); err != nil {
		return note, err
	}
	return note, unreadableIn(page, partial)
}

// unprefixedLocks returns, when locks whose keys start with bare (a prefix
// without the Guard's) are there, a note saying that keys are named
// without the Guard's prefix; "" otherwise. Only a lock read held is said
// to be held: one that could not be read may be one nobody holds any
// longer (a backend keeps a lock's keys after its last holder). The first
// hintPage locks are looked at, so that locks this user may not read,
// which sort first, do not hide one held after them.
func (c *cli) unprefixedLocks(ctx context.Context, bare string) string {
	found, err := c.g.List(ctx, bare, "", hintPage)
	if (err != nil && !errors.Is(err, guard.ErrPartialList)) || len(found) == 0 {
		return ""
	}
	locks, are := "locks", "are held" // under the empty prefix: any lock
	if bare != "" {
		locks = "locks whose keys start with " + shown(bare)
	}
	if !slices.ContainsFunc(found, func(in guard.Inspection) bool { return in.Err == nil }) {
		are = "exist that this user may not read"
	}
	return fmt.Sprintf("%s %s: keys are named without the Guard's prefix (-prefix %q)", locks, are, c.prefix)
}

// hintPage is how many locks unprefixedLocks looks at.
const hintPage = 10

// exitUnreadable is the exit status of a locks ls whose page lists locks
// it could not read (another user's, under the backend's access control),
// or from which the backend left out such locks without naming them: the
// page is printed, the locks it could not read with "?" (-json: with their
// error), and is not the whole answer.
const exitUnreadable = 4

// unreadable is a page's locks that could not be read: how many, and the
// first one's error; and partial, the error that came with the page when
// the backend left out locks without naming them (guard.ErrPartialList).
type unreadable struct {
	n       int
	first   error
	partial error
}

// unreadableIn is the failure of a page that holds locks that could not be
// read, or that came with partial, or nil.
func unreadableIn(page []guard.Inspection, partial error) error {
	u := unreadable{partial: partial}
	for _, in := range page {
		if in.Err != nil {
			if u.n == 0 {
				u.first = in.Err
			}
			u.n++
		}
	}
	if u.n == 0 && partial == nil {
		return nil
	}
	return u
}

func (u unreadable) Error() string {
	var says []string
	if u.partial != nil {
		says = append(says, "the page is not the whole list: "+strings.TrimPrefix(u.partial.Error(), "warden: list: "))
	}
	if u.n > 0 {
		why := strings.TrimPrefix(u.first.Error(), "warden: ")
		if u.n == 1 {
			says = append(says, "a lock listed could not be read (its row shows ?): "+why)
		} else {
			says = append(says, fmt.Sprintf("%d locks listed could not be read (their rows show ?); the first: %s", u.n, why))
		}
	}
	return strings.Join(says, "; ")
}

func (u unreadable) Unwrap() []error {
	var errs []error
	for _, err := range []error{u.partial, u.first} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func (u unreadable) ExitCode() int { return exitUnreadable }

// nextPage is the note after a page of locks ls that more locks follow
// last, the last one listed, saying how to ask for them: -after as a table
// shows the key, with -quoted when it is quoted, written as one word for a
// shell so that it can be pasted.
func nextPage(last string) string {
	if after := shown(last); after != last {
		return "more locks follow; the next page is -quoted -after " + shellWord(after)
	}
	return "more locks follow; the next page is -after " + shellWord(last)
}

// shellWord is s as one word for a POSIX shell: as it is when no character
// of it means anything to the shell, else single-quoted.
func shellWord(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+,=", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// heldUnprefixed returns, when key starts with the Guard's prefix (as the
// backend stores a key, and an operator may have copied it from there) and
// the key without it is held, a note saying so; "" otherwise.
func (c *cli) heldUnprefixed(ctx context.Context, key string) string {
	bare, ok := strings.CutPrefix(key, c.prefix)
	if !ok || c.prefix == "" {
		return ""
	}
	if in, err := c.g.Inspect(ctx, bare); err != nil || len(in.Holders) == 0 {
		return ""
	}
	return fmt.Sprintf("%s is held: keys are named without the Guard's prefix (-prefix %q)", shown(bare), c.prefix)
}

// show prints who holds key; and returns, when key is free but starts with
// the Guard's prefix and the key without it is held, a note saying so: an
// operator who copied the name the backend stores would read "free" as the
// lock being free.
func (c *cli) show(ctx context.Context, key string) (string, error) {
	in, err := c.g.Inspect(ctx, key)
	if err != nil {
		return "", badKeyOr(err)
	}
	note := ""
	if len(in.Holders) == 0 {
		note = c.heldUnprefixed(ctx, key)
	}
	if c.json {
		return note, c.printJSON(inspected(in))
	}
	if len(in.Holders) == 0 {
		fmt.Fprintf(c.stdout, "%s is free (waiters: %s)\n", shown(key), waiters(in.Waiters))
		return note, nil
	}
	tw := c.table("KEY", "OWNER", "TOKEN", "EXPIRES IN", "WAITERS")
	for _, h := range in.Holders {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", shown(key), shown(h.Owner), h.Token, expiresIn(h), waiters(in.Waiters))
	}
	return note, tw.Flush()
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
		return c.storeURL.RedactError(err)
	}
	// The owner token is a capability: only the instance it names, if any.
	instance := debugpage.Instance(rec.Owner)
	if c.json {
		return c.printJSON(struct {
			Scope             string `json:"scope"`
			ScopeBase64       string `json:"scope_base64,omitempty"`
			Key               string `json:"key"`
			KeyBase64         string `json:"key_base64,omitempty"`
			State             string `json:"state"`
			Fingerprint       string `json:"fingerprint"`
			FingerprintBase64 string `json:"fingerprint_base64,omitempty"`
			Instance          string `json:"instance"`
			ResponseBytes     int    `json:"response_bytes"`
		}{rec.Scope, bytesOf(rec.Scope), rec.Key, bytesOf(rec.Key), string(rec.State),
			rec.Fingerprint, bytesOf(rec.Fingerprint), instance, len(rec.Response)})
	}
	tw := c.table("SCOPE", "KEY", "STATE", "FINGERPRINT", "INSTANCE", "RESPONSE")
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d bytes\n", shown(rec.Scope), shown(rec.Key), shown(string(rec.State)), shown(rec.Fingerprint), shown(instance), len(rec.Response))
	return tw.Flush()
}

func (c *cli) idemDelete(ctx context.Context, scope, key string) error {
	var (
		st  idempotency.Store
		del idempotency.Deleter
		rec *idempotency.Record
	)
	err := c.bounded(ctx, func(ctx context.Context) error {
		s, err := c.store(ctx)
		if err != nil {
			return err
		}
		st = s
		var ok bool
		if del, ok = s.(idempotency.Deleter); !ok {
			return fmt.Errorf("this store cannot delete records")
		}
		rec, err = s.Get(ctx, scope, key)
		if errors.Is(err, idempotency.ErrNotFound) {
			return fmt.Errorf("no record under scope %q, key %q", scope, key)
		}
		return c.storeURL.RedactError(err)
	})
	if err != nil {
		return c.change.before(ctx, err)
	}
	if !c.yes {
		of := "" // an owner token may name no instance (an Executor's)
		if inst := debugpage.Instance(rec.Owner); inst != "" {
			of = " of instance " + shown(inst)
		}
		yes, err := c.ask(ctx, fmt.Sprintf("delete the %s record%s under scope %s, key %s? The next request with this key runs again. [y/N] ",
			shown(string(rec.State)), of, shown(scope), shown(key)))
		if err != nil {
			return err
		}
		if !yes {
			return errors.New("not deleted")
		}
		c.restartBound()
	}
	err = c.bounded(ctx, func(ctx context.Context) error {
		// Only the record shown: one claimed or completed by another
		// request since (the claim shown lapsed while the prompt waited)
		// is left, and so is a claim shown in progress that its owner
		// completed since (its result kept: a retry replays it rather
		// than run the work again). Abandon removes an in-progress claim
		// of that owner only; a completed record is final.
		remove := func() error { return del.Delete(ctx, scope, key, rec.Owner) }
		if rec.State == idempotency.StateInProgress {
			remove = func() error { return st.Abandon(ctx, scope, key, rec.Owner) }
		}
		if err := c.storeURL.RedactError(remove()); err != nil {
			if errors.Is(err, idempotency.ErrNotOwner) {
				return recordChanged{scope, key}
			}
			return notSentOr(err)
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
	})
	return c.change.sent(ctx, err)
}

func (c *cli) ping(ctx context.Context) error {
	start := time.Now()
	if err := c.pinger(ctx); err != nil {
		return err
	}
	took := time.Since(start)
	if c.json {
		return c.printJSON(struct {
			Backend string  `json:"backend"`
			Ms      float64 `json:"ms"`
		}{c.backend, float64(took.Microseconds()) / 1000})
	}
	fmt.Fprintf(c.stdout, "%s answered in %v\n", c.backend, took.Round(10*time.Microsecond))
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

// inspection is a guard.Inspection as JSON prints it: with key_base64, the
// key's bytes exactly, when the key is not UTF-8 (another client wrote it),
// since JSON turns each invalid byte into U+FFFD.
type inspection struct {
	guard.Inspection
	KeyBase64 string `json:"key_base64,omitempty"`
	// Holders and Waiters stand for the Inspection's: [] and a count
	// when the lock was read, null when it could not be, so that a script
	// that misses Error does not read an unreadable lock as free.
	Holders []guard.Holder `json:"holders"`
	Waiters *int           `json:"waiters"`
	// Error is why a lock listed could not be read.
	Error string `json:"error,omitempty"`
}

func inspected(in guard.Inspection) inspection {
	out := inspection{Inspection: in, KeyBase64: bytesOf(in.Key)}
	if in.Err != nil {
		out.Error = strings.TrimPrefix(in.Err.Error(), "warden: ")
		return out
	}
	out.Holders, out.Waiters = nonNil(in.Holders), &in.Waiters
	return out
}

// bytesOf is s in base64 when s is not UTF-8, for JSON beside s itself,
// where each invalid byte shows as U+FFFD; "" otherwise.
func bytesOf(s string) string {
	if utf8.ValidString(s) {
		return ""
	}
	return base64.StdEncoding.EncodeToString([]byte(s))
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

// unquoted is a name (a prefix, a key, a scope, -after) given with
// -quoted: a Go-quoted string, the form a table prints a name in when it
// holds what a terminal would obey or a table would hide, so that a name
// printed can be given back as printed, even one holding a NUL, which argv
// cannot carry as it is (an Executor's binary key, or a scope httpmw stored
// as its hash). Quoting is asked for, never guessed from a leading quote:
// a key that starts with one, given as -json printed it, would otherwise
// name another key, and a release take another service's lock.
func unquoted(s string) (string, error) {
	name, err := strconv.Unquote(s)
	if err != nil || !strings.HasPrefix(s, `"`) {
		return "", badInput("%s is not a Go-quoted string, which -quoted asks every name to be", strconv.Quote(s))
	}
	return name, nil
}

// shown is how a key, owner or value from a backend is printed for people:
// as it is, or "-" when empty, unless a terminal would obey or reorder some
// of it (C0 and C1 controls, bidirectional marks and overrides, anything
// unprintable or not UTF-8), a table would hide some of it (a space at
// either end), or it could be read as something else ("-", or a quote
// first); then quoted and escaped, as %q does, so that what is printed is
// what is there.
func shown(s string) string {
	if s == "" {
		return "-"
	}
	if !utf8.ValidString(s) || s == "-" || strings.HasPrefix(s, `"`) || strings.TrimSpace(s) != s ||
		strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) {
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
