.PHONY: setup fixtures serve test test-unit bench ray-up ray-down
setup:      ## create .venv with vLLM 0.32 and the plugin
	bash scripts/setup.sh
fixtures:   ## build both fixture pairs (cached under .cache/fixtures)
	bash scripts/setup.sh && .venv/bin/python -m specdec_fixtures --pair all
serve:      ## serve the ci fixture target with the plugin on 127.0.0.1:8000
	bash scripts/serve.sh
test:       ## the whole CI test suite
	bash scripts/test.sh
test-unit:  ## fast tier only
	bash scripts/test.sh -m unit
ray-up:     ## Ray Serve: 2 CPU replicas of the plugin on the ci fixtures; prints the OpenAI endpoint
	.venv/bin/python deploy/ray/cluster.py up
ray-down:   ## stop everything ray-up started and remove its files
	.venv/bin/python deploy/ray/cluster.py down
