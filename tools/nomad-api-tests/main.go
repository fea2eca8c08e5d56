// Command nomad-api-tests runs the tests of Nomad's Go API client (the module
// github.com/hashicorp/nomad/api, unchanged, from the module cache) that start an agent,
// against poolkeeper's simulator, and prints each test's outcome in a table.
//
// The tests' internal/testutil starts `nomad agent` from PATH: this program builds the
// stand-in of ./nomad into -bin and puts that folder first on PATH (with the folder of the
// `poolkeeper` program it finds), then runs `go test -json` on the API package.
//
// The tests that start an agent are found in the module's own test files: the Test
// functions that reach makeClient, makeACLClient or testutil.NewTestServer. Each belongs
// to an area (areaOf). expected-pass.txt lists the tests that pass against the simulator;
// the run fails when one of them fails or does not run (or no longer exists), and names
// the tests that pass without being listed. A test the module skips itself (some require
// root) is shown as skipped.
//
//	go run . [-areas poolkeeper|all] [-run REGEXP] [-parallel N] [-bin DIR] [-v]
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

const apiPackage = "github.com/hashicorp/nomad/api"

// agentStarters are the functions of the API's tests that start an agent.
var agentStarters = map[string]bool{"makeClient": true, "makeACLClient": true, "NewTestServer": true}

// poolkeeperAreas are the areas of Nomad's API that poolkeeper uses, in the table's order.
var poolkeeperAreas = []string{
	"jobs", "allocations", "evaluations", "deployments", "nodes", "events",
	"variables", "exec-fs", "namespaces", "acl",
}

// areaByFile gives each test file of the API package its area; the ACL file is split in
// areaOf. Files not named here are areas of their own ("other: <file>").
var areaByFile = map[string]string{
	"jobs_test.go":         "jobs",
	"allocations_test.go":  "allocations",
	"evaluations_test.go":  "evaluations",
	"deployments_test.go":  "deployments",
	"nodes_test.go":        "nodes",
	"event_stream_test.go": "events",
	"variables_test.go":    "variables",
	"fs_test.go":           "exec-fs",
	"namespace_test.go":    "namespaces",
}

// aclTokensAndPolicies matches the ACL tests of tokens and policies (not roles, auth
// methods, binding rules or workload identities).
var aclTokensAndPolicies = regexp.MustCompile(`^TestACL(Policies|Tokens)_|^TestACL_OneTimeToken$`)

func areaOf(file, test string) string {
	if file == "acl_test.go" {
		if aclTokensAndPolicies.MatchString(test) {
			return "acl"
		}
		return "other: acl roles, auth methods"
	}
	if area, ok := areaByFile[file]; ok {
		return area
	}
	return "other: " + strings.TrimSuffix(file, "_test.go")
}

type agentTest struct {
	name, area string
}

type result struct {
	outcome string // pass, fail, skip, or "-" when it did not run
	seconds float64
	output  []string
}

func main() {
	areas := flag.String("areas", "all", "poolkeeper (the areas poolkeeper uses) or all")
	run := flag.String("run", "", "only the tests whose names match this regular expression")
	parallel := flag.Int("parallel", 8, "tests run at once (each starts a simulator)")
	bin := flag.String("bin", "", "where the nomad stand-in is built (required)")
	expectFile := flag.String("expect", "expected-pass.txt", "the tests that must pass")
	verbose := flag.Bool("v", false, "print the output of every failed test, not only regressions'")
	record := flag.Bool("record", false, "add the tests that passed to the -expect file")
	flag.Parse()
	if *bin == "" || (*areas != "all" && *areas != "poolkeeper") {
		flag.Usage()
		os.Exit(2)
	}
	if err := runSuite(*areas, *run, *parallel, *bin, *expectFile, *verbose, *record); err != nil {
		fmt.Fprintln(os.Stderr, "nomad-api-tests:", err)
		os.Exit(1)
	}
}

func runSuite(areas, runPattern string, parallel int, bin, expectFile string, verbose, record bool) error {
	started := time.Now()
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	dir, files, err := apiTestFiles()
	if err != nil {
		return err
	}
	all, err := findAgentTests(dir, files)
	if err != nil {
		return err
	}
	expected, err := readExpected(expectFile)
	if err != nil {
		return err
	}
	for name := range expected {
		if !selected(all, name) {
			return fmt.Errorf("%s lists %s, which is no test of %s that starts an agent", expectFile, name, apiPackage)
		}
	}
	tests, err := selectTests(all, areas, runPattern)
	if err != nil {
		return err
	}
	path, err := preparePath(bin)
	if err != nil {
		return err
	}
	names := make([]string, len(tests))
	for i, test := range tests {
		names[i] = regexp.QuoteMeta(test.name)
	}
	fmt.Printf("nomad-api-tests: %d tests of %s (in %s), %d at a time\n", len(tests), apiPackage, dir, parallel)
	logFile := filepath.Join(filepath.Dir(bin), "last-run.jsonl")
	results, goTestErr := goTest(path, "^("+strings.Join(names, "|")+")$", parallel, logFile)
	if goTestErr != nil && results == nil {
		return goTestErr
	}
	regressions, newlyPassing := report(tests, results, expected, verbose)
	fmt.Printf("nomad-api-tests: %s in all\n", time.Since(started).Round(time.Second))
	if record && len(newlyPassing) > 0 {
		if err := appendLines(expectFile, newlyPassing); err != nil {
			return err
		}
		fmt.Printf("nomad-api-tests: %d tests added to %s\n", len(newlyPassing), expectFile)
	}
	if len(regressions) > 0 {
		return fmt.Errorf("%d tests listed in %s did not pass: %s", len(regressions), expectFile, strings.Join(regressions, ", "))
	}
	return nil
}

// apiTestFiles finds the API package's folder in the module cache and its test files for
// this platform (build tags applied: the enterprise-only files are left out).
func apiTestFiles() (string, []string, error) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}\n{{range .TestGoFiles}}{{.}}\n{{end}}", apiPackage).Output()
	if err != nil {
		return "", nil, fmt.Errorf("go list %s: %w", apiPackage, describe(err))
	}
	lines := strings.Fields(string(out))
	if len(lines) < 2 {
		return "", nil, fmt.Errorf("go list %s: no test files", apiPackage)
	}
	return lines[0], lines[1:], nil
}

// findAgentTests reads the test files and returns the Test functions that start an agent,
// directly or through the files' other functions, sorted by area and name.
func findAgentTests(dir string, files []string) ([]agentTest, error) {
	fset := token.NewFileSet()
	calls := map[string]map[string]bool{} // function -> the functions it calls
	fileOf := map[string]string{}
	for _, file := range files {
		parsed, err := parser.ParseFile(fset, filepath.Join(dir, file), nil, 0)
		if err != nil {
			return nil, err
		}
		for _, decl := range parsed.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil {
				continue
			}
			called := map[string]bool{}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if call, ok := n.(*ast.CallExpr); ok {
					switch f := call.Fun.(type) {
					case *ast.Ident:
						called[f.Name] = true
					case *ast.SelectorExpr:
						called[f.Sel.Name] = true
					}
				}
				return true
			})
			calls[fn.Name.Name] = called
			fileOf[fn.Name.Name] = file
		}
	}
	starts := map[string]bool{}
	for changed := true; changed; {
		changed = false
		for fn, called := range calls {
			if starts[fn] {
				continue
			}
			for callee := range called {
				if agentStarters[callee] || starts[callee] {
					starts[fn] = true
					changed = true
					break
				}
			}
		}
	}
	var tests []agentTest
	for fn := range starts {
		if strings.HasPrefix(fn, "Test") && !agentStarters[fn] {
			tests = append(tests, agentTest{fn, areaOf(fileOf[fn], fn)})
		}
	}
	sort.Slice(tests, func(i, j int) bool {
		if ai, aj := areaRank(tests[i].area), areaRank(tests[j].area); ai != aj {
			return ai < aj
		}
		if tests[i].area != tests[j].area {
			return tests[i].area < tests[j].area
		}
		return tests[i].name < tests[j].name
	})
	return tests, nil
}

func areaRank(area string) int {
	for i, a := range poolkeeperAreas {
		if a == area {
			return i
		}
	}
	return len(poolkeeperAreas)
}

func selectTests(tests []agentTest, areas, runPattern string) ([]agentTest, error) {
	var match *regexp.Regexp
	if runPattern != "" {
		var err error
		if match, err = regexp.Compile(runPattern); err != nil {
			return nil, fmt.Errorf("-run: %w", err)
		}
	}
	var chosen []agentTest
	for _, test := range tests {
		if areas == "poolkeeper" && areaRank(test.area) == len(poolkeeperAreas) {
			continue
		}
		if match != nil && !match.MatchString(test.name) {
			continue
		}
		chosen = append(chosen, test)
	}
	if len(chosen) == 0 {
		return nil, errors.New("no test selected")
	}
	return chosen, nil
}

// readExpected reads the names of the tests that must pass: one a line, # comments.
func readExpected(file string) (map[string]bool, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	expected := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			expected[line] = true
		}
	}
	return expected, nil
}

// preparePath builds the nomad stand-in into bin and returns the PATH the tests get: bin,
// then the folder of the poolkeeper program found on PATH, then PATH.
func preparePath(bin string) (string, error) {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "nomad"), "./nomad")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building the nomad stand-in: %w", err)
	}
	poolkeeper, err := exec.LookPath("poolkeeper")
	if err != nil {
		return "", fmt.Errorf("poolkeeper is not on PATH (make nomad-api-tests puts .venv/bin there): %w", err)
	}
	return strings.Join([]string{bin, filepath.Dir(poolkeeper), os.Getenv("PATH")}, string(os.PathListSeparator)), nil
}

// testEvent is one line of `go test -json` (cmd/test2json).
type testEvent struct {
	Action  string
	Test    string
	Elapsed float64
	Output  string
}

// goTest runs the tests and reads their outcomes; every line of `go test -json` is kept
// in logFile, for what the table leaves out (the simulators' own output among it).
func goTest(path, pattern string, parallel int, logFile string) (map[string]*result, error) {
	log, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command("go", "test", "-json", "-count=1", "-timeout=20m",
		fmt.Sprintf("-parallel=%d", parallel), "-run", pattern, apiPackage)
	cmd.Env = append(os.Environ(), "PATH="+path)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	results := map[string]*result{}
	scanner := bufio.NewScanner(stdout)
	scanner.Buffer(make([]byte, 1<<20), 16<<20)
	for scanner.Scan() {
		_, _ = log.Write(append(scanner.Bytes(), '\n'))
		var event testEvent
		if json.Unmarshal(scanner.Bytes(), &event) != nil || event.Test == "" {
			continue
		}
		top, _, _ := strings.Cut(event.Test, "/")
		r := results[top]
		if r == nil {
			r = &result{outcome: "-"}
			results[top] = r
		}
		switch event.Action {
		case "output":
			r.output = append(r.output, strings.TrimRight(event.Output, "\n"))
		case "pass", "fail", "skip":
			if event.Test == top {
				r.outcome, r.seconds = event.Action, event.Elapsed
			}
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	// go test exits non-zero when a test fails: the outcomes say which.
	return results, cmd.Wait()
}

// report prints the table and the summary per area; it returns the expected passes that
// did not pass, and the tests that passed without being expected to.
func report(tests []agentTest, results map[string]*result, expected map[string]bool, verbose bool) ([]string, []string) {
	type tally struct{ passed, total int }
	tallies := map[string]*tally{}
	var order []string
	var regressions, newlyPassing, failedOthers []string
	fmt.Printf("\n%-16s %-48s %-8s %-8s %s\n", "area", "test", "outcome", "expected", "seconds")
	for _, test := range tests {
		r := results[test.name]
		if r == nil {
			r = &result{outcome: "-"}
		}
		want := "fail"
		if expected[test.name] {
			want = "pass"
		}
		mark := ""
		switch {
		case want == "pass" && r.outcome == "skip":
			// The module's own choice (testutil.RequireRoot, SkipSlow): said, not failed.
			mark = "  <- skipped by the module itself"
		case want == "pass" && r.outcome != "pass":
			mark = "  <- REGRESSION"
			regressions = append(regressions, test.name)
		case want != "pass" && r.outcome == "pass":
			mark = "  <- passes: list it in expected-pass.txt"
			newlyPassing = append(newlyPassing, test.name)
		case r.outcome != "pass":
			failedOthers = append(failedOthers, test.name)
		}
		fmt.Printf("%-16s %-48s %-8s %-8s %7.1f%s\n", test.area, test.name, r.outcome, want, r.seconds, mark)
		t := tallies[test.area]
		if t == nil {
			t = &tally{}
			tallies[test.area] = t
			order = append(order, test.area)
		}
		t.total++
		if r.outcome == "pass" {
			t.passed++
		}
	}
	fmt.Printf("\n%-34s %s\n", "area", "passed")
	var ours tally
	for _, area := range order {
		t := tallies[area]
		fmt.Printf("%-34s %d of %d\n", area, t.passed, t.total)
		if areaRank(area) < len(poolkeeperAreas) {
			ours.passed += t.passed
			ours.total += t.total
		}
	}
	fmt.Printf("%-34s %d of %d\n", "the areas poolkeeper uses", ours.passed, ours.total)
	for name := range expected {
		if _, ok := results[name]; !ok && selected(tests, name) {
			regressions = append(regressions, name)
		}
	}
	shown := regressions
	if verbose {
		shown = append(shown, failedOthers...)
	}
	for _, name := range shown {
		if r := results[name]; r != nil {
			fmt.Printf("\n--- output of %s (last 40 lines)\n%s\n", name, tail(r.output, 40))
		}
	}
	if len(newlyPassing) > 0 {
		fmt.Printf("\npassing but not listed in expected-pass.txt: %s\n", strings.Join(newlyPassing, " "))
	}
	return regressions, newlyPassing
}

// appendLines adds names to the expectations file, keeping it sorted (after its comments).
func appendLines(file string, names []string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var header, listed []string
	for _, line := range strings.Split(strings.TrimRight(string(raw), "\n"), "\n") {
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			header = append(header, line)
		} else {
			listed = append(listed, line)
		}
	}
	listed = append(listed, names...)
	sort.Strings(listed)
	return os.WriteFile(file, []byte(strings.Join(append(header, listed...), "\n")+"\n"), 0o644)
}

func selected(tests []agentTest, name string) bool {
	for _, test := range tests {
		if test.name == name {
			return true
		}
	}
	return false
}

func tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func describe(err error) error {
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && len(bytes.TrimSpace(exitErr.Stderr)) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(exitErr.Stderr))
	}
	return err
}
