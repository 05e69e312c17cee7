#!/bin/sh
# The images' entrypoint: edge-runtime's own command lines need no program in front, so a container
# takes the argv the Router's process manager builds (serve --models F --uds S ...) as it is; any
# other command (python -m edge_runtime ..., a shell) runs as given.
case "${1:-}" in
    serve|models|check|devices|examples|-*) exec edge-runtime "$@" ;;
esac
exec "$@"
