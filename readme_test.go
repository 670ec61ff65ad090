package warden_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeSnippetsCompile type-checks every Go block of README.md as the
// program it is, imports included, so that the guide newcomers copy from
// never drifts from the API.
func TestReadmeSnippetsCompile(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var snippets []string
	rest := string(readme)
	for {
		start := strings.Index(rest, "```go\n")
		if start < 0 {
			break
		}
		rest = rest[start+len("```go\n"):]
		end := strings.Index(rest, "```")
		if end < 0 {
			t.Fatal("README.md: a Go block is not closed")
		}
		snippets = append(snippets, rest[:end])
		rest = rest[end:]
	}
	if len(snippets) == 0 {
		t.Fatal("README.md has no Go snippets")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool in PATH: %v", err)
	}
	// Inside the module, so that the snippets' imports resolve against it;
	// a leading underscore keeps the directory out of ./... patterns.
	dir, err := os.MkdirTemp(".", "_readme_")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var pkgs []string
	for i, s := range snippets {
		if !strings.HasPrefix(s, "package ") {
			t.Errorf("README.md Go block %d is not a whole file (it does not start with a package clause):\n%s", i+1, s)
			continue
		}
		sub := filepath.Join(dir, "snippet"+string(rune('a'+i)))
		pkgs = append(pkgs, "./"+filepath.ToSlash(sub))
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, "main.go"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(pkgs) == 0 {
		return
	}
	// Named one by one: "..." patterns skip directories whose names begin
	// with an underscore.
	out, err := exec.Command(goTool, append([]string{"vet"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("README.md's Go snippets do not compile:\n%s", out)
	}
}
