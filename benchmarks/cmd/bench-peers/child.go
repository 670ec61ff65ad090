package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// childFlag, first on a command line, makes the program a group's process:
// -bench-peers-child=GROUP:FILE measures GROUP with the flags that follow
// and writes its figures to FILE. Only the parent passes it, so -h does not
// list it.
//
// Each group runs in a process of its own, as the services of its users
// would, each with the clients of the one engine it uses: in one process,
// the idle clients, goroutines and heap of the other engines' subjects
// shaped a group's figures (PostgreSQL's one-worker ratio against raw pgx
// was 0.90-0.94 measured alone, 0.73-0.81 beside every other group).
const childFlag = "-bench-peers-child"

// childGrace is how long an interrupted group's process has to stop and
// remove its keys (its cleanup is bounded by 30s) before it is killed.
const childGrace = time.Minute

// childArgs tells a group's command line from the parent's: it returns the
// group, the results file and the rest of the flags.
func childArgs(args []string) (group, path string, rest []string, ok bool) {
	if len(args) == 0 {
		return "", "", nil, false
	}
	spec, ok := strings.CutPrefix(args[0], childFlag+"=")
	if !ok {
		return "", "", nil, false
	}
	group, path, ok = strings.Cut(spec, ":")
	return group, path, args[1:], ok
}

// runChild measures one group in this process and writes its figures to
// path.
func runChild(ctx context.Context, group, path string, args []string, stdout io.Writer) error {
	s, err := parseSettings(args, os.Stderr)
	if err != nil {
		return err
	}
	if !slices.Contains(allGroups, group) {
		return fmt.Errorf("%s: unknown group %q", childFlag, group)
	}
	s.groups = []string{group}
	b, err := newBench(s, stdout)
	if err != nil {
		return err
	}
	defer b.close()
	if err := b.connect(ctx, group); err != nil {
		return err
	}
	if err := b.measureAll(ctx); err != nil {
		return err
	}
	data, err := b.handOff()
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// measureGroups runs each group of the settings in a process of its own,
// one after the other, and takes over their figures. A group whose process
// fails is left out, as a group whose servers do not answer is, or fails
// the run with -strict.
func (b *bench) measureGroups(ctx context.Context, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-peers-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(b.log, "bench-peers: groups %s, each in a process of its own\n", strings.Join(b.s.groups, ","))
	b.start = time.Now()
	for _, g := range b.s.groups {
		why := b.measureGroup(ctx, exe, filepath.Join(dir, g+".json"), g, args)
		switch {
		case why == "":
			b.groups = append(b.groups, g)
			continue
		case ctx.Err() != nil:
			return fmt.Errorf("%w (%s: %s)", ctx.Err(), g, why)
		case b.s.strict:
			return fmt.Errorf("%s: %s", g, why)
		}
		b.skipped[g] = why
		fmt.Fprintf(b.log, "leaving out %s: %s\n", g, why)
	}
	b.end = time.Now()
	if len(b.groups) == 0 {
		return fmt.Errorf("no group was measured: %v", b.skipped)
	}
	return nil
}

// measureGroup runs group's process and takes over its figures; it returns
// why it could not, or "".
func (b *bench) measureGroup(ctx context.Context, exe, path, group string, args []string) string {
	cmd := exec.CommandContext(ctx, exe, append([]string{childFlag + "=" + group + ":" + path}, args...)...)
	var stderr bytes.Buffer
	cmd.Stdout = b.log
	cmd.Stderr = io.MultiWriter(os.Stderr, &stderr)
	// Interrupted, as by Ctrl-C, the process stops its measurement and
	// removes what it left on the servers, which a kill would not let it.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = childGrace
	if err := cmd.Run(); err != nil {
		if last := lastLine(stderr.String()); last != "" {
			return fmt.Sprintf("%s (its process: %v)", strings.TrimPrefix(last, "bench-peers: "), err)
		}
		return fmt.Sprintf("its process: %v", err)
	}
	if err := b.takeOver(path); err != nil {
		return fmt.Sprintf("its figures: %v", err)
	}
	return ""
}

// takeOver adds the figures a group's process wrote to path to b's.
func (b *bench) takeOver(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return b.merge(data)
}

// lastLine is the last line of s that is not blank: a failed process's
// error.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
