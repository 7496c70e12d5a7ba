package deploytest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestComposeTools runs the quickstart through the Compose tools of Debian
// 12, which read it differently from docker compose v2: docker-compose
// 1.29's `config` (its own schema: it rejects a top-level name:) and
// podman-compose 1.0.3's `up` in dry run (it crashed on a service's
// networks: aliases), with podman replaced by true so that nothing is
// created. `make deps` installs both; without them the test is skipped.
func TestComposeTools(t *testing.T) {
	const file = "../compose/compose.yaml"
	// SLUICE_IMAGE unset: the file's default applies (podman-compose 1.0.3
	// takes a set but empty variable as the empty name).
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SLUICE_IMAGE=") {
			env = append(env, e)
		}
	}
	command := func(name string, args ...string) *exec.Cmd {
		c := exec.Command(name, args...)
		c.Env = env
		return c
	}
	t.Run("docker-compose 1.29", func(t *testing.T) {
		if _, err := exec.LookPath("docker-compose"); err != nil {
			t.Skip("docker-compose is not installed (make deps)")
		}
		out, err := command("docker-compose", "-f", file, "config").CombinedOutput()
		if err != nil {
			t.Fatalf("docker-compose config: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "image: localhost/sluice:dev") {
			t.Errorf("docker-compose config does not name the image localhost/sluice:dev:\n%s", out)
		}
	})
	t.Run("podman-compose 1.0.3", func(t *testing.T) {
		if _, err := exec.LookPath("podman-compose"); err != nil {
			t.Skip("podman-compose is not installed (make deps)")
		}
		truePath, err := exec.LookPath("true")
		if err != nil {
			t.Fatal(err)
		}
		out, err := command("podman-compose", "--podman-path", truePath, "--dry-run", "-f", file, "up", "-d").CombinedOutput()
		if err != nil || strings.Contains(string(out), "Traceback") {
			t.Fatalf("podman-compose up: %v\n%s", err, out)
		}
		// Both replicas answer to the name Envoy and Prometheus use.
		var sluices int
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, truePath+" run ") && strings.Contains(l, "--network-alias sluice ") {
				sluices++
				if !strings.Contains(l, " localhost/sluice:dev serve ") {
					t.Errorf("a sluice container does not run localhost/sluice:dev: %s", l)
				}
			}
		}
		if sluices != 2 {
			t.Errorf("%d containers answer to sluice, want 2:\n%s", sluices, out)
		}
	})
}
