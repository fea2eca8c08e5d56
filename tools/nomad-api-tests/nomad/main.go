// Command nomad stands in for Nomad's agent where Nomad's own API tests look for it: their
// internal/testutil starts `nomad agent -config FILE [-dev]` from PATH and stops it with
// SIGINT. This program reads the agent configuration testutil writes (JSON) and becomes
// `poolkeeper sim` with:
//
//   - the HTTP port of `ports.http` on 127.0.0.1: this program binds it at once and hands
//     the listening socket down (`--listen-fd 3`), so that the port testutil picked (and
//     released) is held within milliseconds rather than after the simulator's start-up,
//     when another test may have been given the same free port,
//   - ACLs enforced when `acl.enabled` (`--acl-enabled`),
//   - one client node named `name` when the agent runs a client (`-dev`, or
//     `client.enabled`), none otherwise (`--no-client`), registered in the whole second
//     after this program's start, as a real agent's is no sooner.
//
// The simulator runs as this program's child and stops with it: SIGINT or SIGTERM are
// passed on (and this program exits as the simulator does); when this program's parent,
// the test binary, ends without stopping the agent (a test that failed while waiting for
// it), or this program is killed, the simulator gets SIGTERM.
//
// `nomad -version` answers the Nomad version the simulator follows. The simulator is the
// `poolkeeper` program on PATH, or $POOLKEEPER when set.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// simulatedVersion is the Nomad release whose behaviour the simulator follows.
const simulatedVersion = "1.9.7"

// agentConfig is the part of Nomad's agent configuration the simulator takes.
type agentConfig struct {
	Name  string `json:"name"`
	Ports struct {
		HTTP int `json:"http"`
	} `json:"ports"`
	ACL struct {
		Enabled bool `json:"enabled"`
	} `json:"acl"`
	Client struct {
		Enabled bool `json:"enabled"`
	} `json:"client"`
}

func main() {
	args := os.Args[1:]
	if len(args) == 1 && (args[0] == "-version" || args[0] == "--version" || args[0] == "version") {
		fmt.Printf("Nomad v%s (poolkeeper sim)\n", simulatedVersion)
		return
	}
	if len(args) == 0 || args[0] != "agent" {
		fail("usage: nomad agent [-dev] -config FILE | nomad -version")
	}
	simArgs, port, err := translate(args[1:])
	if err != nil {
		fail(err.Error())
	}
	listener, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		fail(err.Error())
	}
	socket, err := listener.(*net.TCPListener).File()
	if err != nil {
		fail(err.Error())
	}
	// A real agent registers its client node a second or more after it starts (it
	// fingerprints the host first), and Nomad's tests rely on that: TestNodes_Info wants
	// the node's StatusUpdatedAt, in whole seconds, later than a time taken before the
	// agent started. The simulator registers its node as it starts, within a second of
	// this program's start, so it starts in the next whole second (the port is held).
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	program := os.Getenv("POOLKEEPER")
	if program == "" {
		if program, err = exec.LookPath("poolkeeper"); err != nil {
			fail("poolkeeper is not on PATH (or set POOLKEEPER): " + err.Error())
		}
	}
	os.Exit(supervise(program, simArgs, listener, socket))
}

// supervise runs the simulator (serving on `socket`) until it exits; its exit code.
func supervise(program string, args []string, listener net.Listener, socket *os.File) int {
	// The child's death signal fires when the thread that started it ends: keep this
	// goroutine on its thread for good, so that only this process's end fires it.
	runtime.LockOSThread()
	parent := os.Getppid()
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	sim := exec.Command(program, args...)
	sim.Stdout, sim.Stderr = os.Stdout, os.Stderr
	sim.ExtraFiles = []*os.File{socket} // file descriptor 3
	sim.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := sim.Start(); err != nil {
		fail(fmt.Sprintf("cannot run %s: %v", program, err))
	}
	// The simulator has its own copy: the port is its alone, and closes with it.
	_ = socket.Close()
	_ = listener.Close()
	exited := make(chan error, 1)
	go func() { exited <- sim.Wait() }()
	orphaned := time.NewTicker(200 * time.Millisecond)
	defer orphaned.Stop()
	for {
		select {
		case sig := <-signals:
			_ = sim.Process.Signal(sig)
		case <-orphaned.C:
			if os.Getppid() != parent {
				_ = sim.Process.Signal(syscall.SIGTERM)
			}
		case err := <-exited:
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				return exitErr.ExitCode()
			}
			if err != nil {
				return 1
			}
			return 0
		}
	}
}

// translate turns the agent's flags into `poolkeeper sim`'s arguments, and the HTTP port.
func translate(args []string) ([]string, int, error) {
	flags := flag.NewFlagSet("nomad agent", flag.ContinueOnError)
	dev := flags.Bool("dev", false, "a development agent: a server and a client")
	configFile := flags.String("config", "", "the agent's configuration (JSON)")
	if err := flags.Parse(args); err != nil {
		return nil, 0, err
	}
	if flags.NArg() > 0 {
		return nil, 0, fmt.Errorf("unexpected arguments %q", flags.Args())
	}
	if *configFile == "" {
		return nil, 0, errors.New("-config FILE is required")
	}
	raw, err := os.ReadFile(*configFile)
	if err != nil {
		return nil, 0, err
	}
	var config agentConfig
	if err := json.Unmarshal(raw, &config); err != nil {
		return nil, 0, fmt.Errorf("%s: only JSON agent configurations are understood: %w", *configFile, err)
	}
	if config.Ports.HTTP <= 0 {
		return nil, 0, fmt.Errorf("%s: no ports.http", *configFile)
	}
	simArgs := []string{"sim", "--listen-fd", "3"}
	if config.ACL.Enabled {
		simArgs = append(simArgs, "--acl-enabled")
	}
	// As Nomad merges a configuration into -dev's, `client.enabled = false` does not turn
	// the dev agent's client off.
	if *dev || config.Client.Enabled {
		name := config.Name
		if name == "" {
			name = "nomad-dev"
		}
		simArgs = append(simArgs, "--node", name)
	} else {
		simArgs = append(simArgs, "--no-client")
	}
	return simArgs, config.Ports.HTTP, nil
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, "nomad (poolkeeper's stand-in): "+message)
	os.Exit(1)
}
