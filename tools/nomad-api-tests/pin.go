package main

// The API module is a requirement of this module (go.mod pins its version and go.sum its
// tests' modules) because this import names it: `go mod tidy` keeps it.
import _ "github.com/hashicorp/nomad/api"
